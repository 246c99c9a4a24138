// tenferro: <stdio.h> for NVRTC, which has no C or C++ library: printf is built in to device code.
#pragma once
