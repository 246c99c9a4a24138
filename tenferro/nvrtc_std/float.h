// tenferro: <float.h> for NVRTC, the C name of <cfloat>.
#pragma once
#include <cfloat>
