// The facade that names a level's factory instead of going through the levels table.
#include "backends/process/process_backend.hpp"
