// Kind 15 — blob tenancy: a request that names another tenant's blob id gets exactly the
// answer a missing blob gets (same code, same message, same everything but the run id), and
// nothing is staged or stored. A tenant can neither read another tenant's blob nor learn that
// it exists — through a run, or through the store's own calls, for the memory store the suite
// uses and for the filesystem store hosts use by default.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "conformance/suite.hpp"
#include "sandbox/json.hpp"

using conformance::py;
using sandbox::code;

namespace {

const std::string owner = "conformance-owner";
const std::string other = "conformance-other";

/// The wire form of a result with its run id blanked: everything a caller could compare.
std::string comparable(sandbox::run_result r) {
  r.run_id.clear();
  return sandbox::encode(r);
}

std::vector<std::string> sorted_list(sandbox::blob_store& s, const std::string& tenant) {
  auto l = s.list(tenant);
  REQUIRE(l.has_value());
  auto v = *l;
  std::sort(v.begin(), v.end());
  return v;
}

/// A well-formed id of content nobody stored.
std::string missing_id(int i) { return sandbox::blob_id_of(fmt::format("never stored {}", i)); }

/// Every store call of `other` on the owner's blob fails exactly as on a missing blob, and
/// changes nothing for the owner.
void check_store(sandbox::blob_store& s, const std::string& secret_id, int dirfd) {
  const std::string absent = missing_id(99);
  auto same_error = [](const auto& a, const auto& b) {
    REQUIRE(!a.has_value());
    REQUIRE(!b.has_value());
    CHECK(a.error() == b.error());
    CHECK(a.error().message() == b.error().message());
  };
  same_error(s.get(other, secret_id), s.get(other, absent));
  same_error(s.size(other, secret_id), s.size(other, absent));
  same_error(s.copy_to(other, secret_id, dirfd, "a"), s.copy_to(other, absent, dirfd, "b"));
  {
    auto a = s.remove(other, secret_id);
    auto b = s.remove(other, absent);
    REQUIRE(!a.has_value());
    REQUIRE(!b.has_value());
    CHECK(a.error() == b.error());
  }
  auto l = s.list(other);
  REQUIRE(l.has_value());
  CHECK(std::find(l->begin(), l->end(), secret_id) == l->end());
  // Nothing was written into the directory, and the owner still has the blob.
  CHECK(::faccessat(dirfd, "a", F_OK, AT_SYMLINK_NOFOLLOW) != 0);
  CHECK(::faccessat(dirfd, "b", F_OK, AT_SYMLINK_NOFOLLOW) != 0);
  auto mine = s.get(owner, secret_id);
  REQUIRE(mine.has_value());
  CHECK(*mine == "the owner's secret rate table");
  // Tenants whose names differ only in case or a trailing dot are other tenants.
  for (const char* lookalike : {"Conformance-owner", "CONFORMANCE-OWNER", "conformance-owner."}) {
    INFO(lookalike);
    same_error(s.get(lookalike, secret_id), s.get(lookalike, absent));
  }
}

}  // namespace

TEST_CASE("tenancy: another tenant's blob answers exactly like a missing one, nothing staged",
          "[tenancy][core]") {
  CONFORMANCE_BACKEND(b);
  const std::string secret = b.put("the owner's secret rate table", owner);
  const std::string mine = b.put("the other tenant's own input", other);
  const auto owner_before = sorted_list(*b.rt().blobs(), owner);
  const auto other_before = sorted_list(*b.rt().blobs(), other);
  auto usage_before = b.rt().blobs()->usage(other);
  REQUIRE(usage_before.has_value());

  // The program would print the input if it ever got it.
  const std::string source =
      "import os\nd = os.environ['SANDBOX_INPUT_DIR']\n"
      "for n in sorted(os.listdir(d)): print(n, open(os.path.join(d, n)).read())\n";
  auto with = [&](std::vector<std::string> ids) {
    auto req = py(source);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      req.files_in.push_back({.name = fmt::format("in{}.csv", i), .blob = ids[i]});
    }
    return req;
  };
  struct variant {
    const char* label;
    std::vector<std::string> foreign, missing;
  };
  const variant variants[] = {
      {"alone", {secret}, {missing_id(0)}},
      {"after the tenant's own blob", {mine, secret}, {mine, missing_id(1)}},
      {"before the tenant's own blob", {secret, mine}, {missing_id(2), mine}},
      {"named twice", {mine, secret, secret}, {mine, missing_id(3), missing_id(3)}},
  };
  for (const auto& v : variants) {
    INFO(v.label);
    auto foreign = b.run(with(v.foreign), other);
    auto missing = b.run(with(v.missing), other);
    CHECK(foreign.code == code::blob_not_found);
    CHECK(foreign.message == missing.message);
    CHECK(comparable(foreign) == comparable(missing));
    CHECK(foreign.message.find(secret.substr(7)) == std::string::npos);
    CHECK(foreign.std_out.blob.empty());
  }
  // The owner's own run gets it (so the foreign answer is not a broken blob).
  auto own = b.run(with({secret}), owner);
  REQUIRE(own.code == code::ok);
  CHECK(own.std_out.summary == "in0.csv the owner's secret rate table\n");
  // Only the owner's run stored anything (its stdout); nothing for the other tenant.
  CHECK(sorted_list(*b.rt().blobs(), other) == other_before);
  CHECK(b.rt().blobs()->usage(other).value() == *usage_before);
  for (const auto& id : owner_before) CHECK(b.rt().blobs()->get(owner, id).has_value());

  // The wire form: the same request decoded from JSON answers the same.
  auto wire = sandbox::decode_run_request(
      fmt::format(R"J({{"runtime":"python3","source":"print(1)","files_in":[{{"name":"x",)J"
                  R"J("blob":"{}"}}]}})J",
                  secret));
  REQUIRE(wire.has_value());
  auto wire_missing = *wire;
  wire_missing.files_in[0].blob = missing_id(4);
  CHECK(comparable(b.run(*wire, other)) == comparable(b.run(wire_missing, other)));
}

TEST_CASE("tenancy: the store's own calls never tell another tenant's blob from a missing one",
          "[tenancy][core]") {
  CONFORMANCE_BACKEND(b);
  char tmpl[] = "/tmp/conformance-tenancy-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::filesystem::path dir = tmpl;
  const int dirfd = ::open(tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(dirfd >= 0);
  {
    INFO("the runtime's store");
    const std::string id = b.put("the owner's secret rate table", owner);
    check_store(*b.rt().blobs(), id, dirfd);
  }
  {
    INFO("a filesystem store (the default for hosts)");
    auto fs = sandbox::open_fs_blob_store({.root = dir / "blobs"});
    REQUIRE(fs.has_value());
    auto id = (*fs)->put(owner, "the owner's secret rate table");
    REQUIRE(id.has_value());
    check_store(**fs, *id, dirfd);
  }
  ::close(dirfd);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}
