// A protocol file that includes the run machine.
#include "core/run/machine.hpp"
