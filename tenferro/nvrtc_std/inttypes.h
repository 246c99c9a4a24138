// tenferro: <inttypes.h> for NVRTC, the C name of <cinttypes>.
#pragma once
#include <cinttypes>
