// One level that includes another.
#include "backends/microvm/vmm.hpp"
