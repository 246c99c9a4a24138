// tenferro: <stdint.h> for NVRTC, the C name of <cstdint>.
#pragma once
#include <cstdint>
