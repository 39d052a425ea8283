// Umbrella header: the whole public API of agent-sandbox.
#pragma once

#include "sandbox/admission.hpp"
#include "sandbox/approval.hpp"
#include "sandbox/audit.hpp"
#include "sandbox/backend.hpp"
#include "sandbox/blob_store.hpp"
#include "sandbox/code.hpp"
#include "sandbox/egress.hpp"
#include "sandbox/error.hpp"
#include "sandbox/image_store.hpp"
#include "sandbox/json.hpp"
#include "sandbox/policy.hpp"
#include "sandbox/protocol.hpp"
#include "sandbox/runtime.hpp"
#include "sandbox/signed_ticket.hpp"
#include "sandbox/span.hpp"
#include "sandbox/ticket.hpp"
