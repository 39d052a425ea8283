// Helpers shared by runtime_test.cpp and fake_backend_test.cpp.
#pragma once

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sandbox/runtime.hpp"
#include "sandbox/testing/fake_backend.hpp"

namespace sandbox::test {

inline ticket make_ticket(const std::string& tenant = "acme",
                          sandbox::isolation level = sandbox::isolation::process,
                          bool execute = true) {
  ticket_spec spec;
  spec.id = "t-" + tenant;
  spec.tenant = tenant;
  spec.execute = execute;
  spec.isolation = level;
  auto t = ticket_issuer{}.issue(spec);
  REQUIRE(t.has_value());
  return *t;
}

inline run_request py(std::string source) {
  run_request r;
  r.runtime = "python3";
  r.source = std::move(source);
  return r;
}

/// Collects spans; thread-safe.
class recording_sink : public span_sink {
 public:
  void record(const span& s) noexcept override {
    std::lock_guard lk(mu_);
    spans_.push_back(s);
  }
  std::vector<span> spans() const {
    std::lock_guard lk(mu_);
    return spans_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<span> spans_;
};

/// Waits until `pred()` holds. Not a timing assertion: the bound only turns a hang into a
/// failure.
template <class Pred>
bool eventually(Pred pred, std::chrono::seconds bound = std::chrono::seconds(60)) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline bool is_run_id(const std::string& id) {
  if (id.size() != 16) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

/// A fake runtime that fails the test when it cannot be created.
inline runtime make_fake_runtime(std::shared_ptr<testing::fake_backend> fake,
                                 sandbox::policy policy = {}) {
  auto rt = testing::make_runtime(std::move(fake), std::move(policy));
  REQUIRE(rt.has_value());
  return std::move(*rt);
}

}  // namespace sandbox::test
