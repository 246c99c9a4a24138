// tenferro: <limits.h> for NVRTC, the C name of <climits>.
#pragma once
#include <climits>
