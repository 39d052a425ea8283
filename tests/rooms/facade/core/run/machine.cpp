// The run machine that includes the facade for an option struct.
#include "sandbox/runtime.hpp"
