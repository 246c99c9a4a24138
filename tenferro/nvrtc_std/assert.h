// tenferro: <assert.h> for NVRTC, which has no C or C++ library: assert is built in to device code.
#pragma once
