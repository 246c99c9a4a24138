// tenferro: <stdlib.h> for NVRTC, the C name of <cstdlib>.
#pragma once
#include <cstdlib>
