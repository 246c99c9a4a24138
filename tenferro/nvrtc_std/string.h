// tenferro: <string.h> for NVRTC, the C name of <cstring>.
#pragma once
#include <cstring>
