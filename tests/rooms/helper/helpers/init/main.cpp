// sandbox-init that includes host code.
#include "core/run/cgroup.hpp"
