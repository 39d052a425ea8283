// A store file that reaches the facade by a relative path.
#include "../runtime/runtime_impl.hpp"
