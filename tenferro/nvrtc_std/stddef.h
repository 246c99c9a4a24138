// tenferro: <stddef.h> for NVRTC, the C name of <cstddef>.
#pragma once
#include <cstddef>
