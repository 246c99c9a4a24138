// tenferro: <math.h> for NVRTC, the C name of <cmath>.
#pragma once
#include <cmath>
