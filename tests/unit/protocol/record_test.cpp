// Run records and replay, blob pins and garbage collection (sandbox/record.hpp,
// sandbox/blob_store.hpp), with the fake backend storing real blobs.
#include "sandbox/record.hpp"

#include <sys/stat.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "protocol/sha256.hpp"
#include "sandbox/json.hpp"
#include "unit/runtime/runtime_test_support.hpp"
#include "unit/store/store_test_util.hpp"

namespace {

using sandbox::code;
using sandbox::errc;
using sandbox::make_error_code;
using sandbox::test::make_ticket;
using sandbox::test::py;
using sandbox::testing::fake_backend;
using sandbox::testing::fake_digest;

sandbox::runtime_options options_with(std::shared_ptr<sandbox::blob_store> blobs) {
  sandbox::runtime_options o;
  o.blobs = std::move(blobs);
  o.fixed_digests = {{"python3", fake_digest("python3")}, {"node", fake_digest("node")}};
  o.process_backend = false;
  o.log = [](sandbox::log_level, std::string_view) {};
  return o;
}

sandbox::runtime runtime_on(std::shared_ptr<sandbox::blob_store> blobs) {
  auto rt = sandbox::runtime::create(options_with(std::move(blobs)));
  REQUIRE(rt.has_value());
  auto fake = std::make_shared<fake_backend>(sandbox::isolation::microvm);
  sandbox::testing::scripted_run run;
  run.std_out = "42\n";
  run.std_err = "warn\n";
  run.files_out = {{"out.csv", "a,b\n1,2\n"}};
  fake->otherwise().respond(run);
  rt->add_backend(fake);
  return std::move(*rt);
}

std::shared_ptr<sandbox::blob_store> fs_store(const store_test::temp_dir& dir) {
  auto s = sandbox::open_fs_blob_store({.root = dir / "blobs"});
  REQUIRE(s.has_value());
  return *s;
}

/// Sets the blob's file time `age` into the past (the fs store's GC clock).
void age_blob(const store_test::temp_dir& dir, const std::string& tenant, const std::string& id,
              std::chrono::seconds age) {
  const auto p = dir / "blobs" / "tenants" / tenant / id.substr(7);
  struct timespec ts[2];
  ::clock_gettime(CLOCK_REALTIME, &ts[0]);
  ts[0].tv_sec -= age.count();
  ts[1] = ts[0];
  REQUIRE(::utimensat(AT_FDCWD, p.c_str(), ts, AT_SYMLINK_NOFOLLOW) == 0);
}

}  // namespace

TEST_CASE("a record survives a checkpoint and replays the same result", "[record]") {
  store_test::temp_dir dir;
  const auto request = py("print(42)");
  const auto ticket = make_ticket("acme");
  std::string checkpoint;
  sandbox::run_result first;
  {
    auto rt = runtime_on(fs_store(dir));
    first = rt.run(request, ticket);
    REQUIRE(first.code == code::ok);
    REQUIRE(first.files_out.size() == 1);
    auto rec = sandbox::make_run_record(request, ticket, first);
    CHECK(rec.record_id == first.run_id);
    CHECK(rec.tenant == "acme");
    CHECK(rec.ticket_id == ticket.id());
    CHECK(rec.runtime == first.runtime);
    CHECK(rec.request_sha256 == sandbox::request_digest(request));
    REQUIRE(sandbox::pin_record(*rt.blobs(), rec).has_value());
    checkpoint = sandbox::encode(rec);
  }  // the runtime is gone: a restart
  auto rt = runtime_on(fs_store(dir));
  auto rec = sandbox::decode_run_record(checkpoint);
  REQUIRE(rec.has_value());
  CHECK(sandbox::encode(*rec) == checkpoint);
  auto again = rt.replay(*rec, ticket);
  REQUIRE(again.has_value());
  CHECK(*again == first);
}

TEST_CASE("the request digest covers every field of the request's encoding", "[record]") {
  auto base = py("print(1)");
  const auto d = sandbox::request_digest(base);
  CHECK(d.size() == 64);
  CHECK(d == sandbox::request_digest(base));
  // Each field changes the digest (a field left out of the canonical form would not).
  std::vector<sandbox::run_request> variants(9, base);
  variants[0].runtime = "node";
  variants[1].source = "print(2)";
  variants[2].timeout = std::chrono::milliseconds(1999);
  variants[3].network = true;
  variants[4].egress = {"example.com"};
  variants[5].files_in = {{"a.txt", sandbox::blob_id_of("x")}};
  variants[6].files_out.max_files = 3;
  variants[7].memory_limit_bytes -= 1;
  variants[8].env = {{"TZ", "UTC"}};
  auto pinned = base;
  pinned.runtime_digest = fake_digest("python3");
  variants.push_back(pinned);
  // Fields added by registered tools after the digest was written are covered too: the
  // digest hashes the codec's full encoding.
  sandbox::run_request tool;
  tool.tool = "render";
  variants.push_back(tool);
  auto with_stdin = tool;
  with_stdin.std_in = "# title";
  variants.push_back(with_stdin);
  auto with_blob = tool;
  with_blob.stdin_blob = sandbox::blob_id_of("# title");
  variants.push_back(with_blob);
  std::set<std::string> seen{d};
  for (const auto& v : variants) CHECK(seen.insert(sandbox::request_digest(v)).second);
  // The digest is SHA-256 of the documented canonical form: encode(request).
  CHECK(d == sandbox::detail::sha256_hex(sandbox::encode(base)));
}

TEST_CASE("replay after the blob was collected names the missing blob", "[record][gc]") {
  store_test::temp_dir dir;
  auto store = fs_store(dir);
  auto rt = runtime_on(store);
  const auto request = py("print(42)");
  const auto ticket = make_ticket("acme");
  auto result = rt.run(request, ticket);
  REQUIRE(result.code == code::ok);
  auto rec = sandbox::make_run_record(request, ticket, result);
  REQUIRE(sandbox::pin_record(*store, rec).has_value());
  for (const auto& id : sandbox::record_blobs(rec))
    age_blob(dir, "acme", id, std::chrono::hours(2));

  // Pinned: the collection keeps every blob, replay works.
  auto report = store->collect_garbage({});
  REQUIRE(report.has_value());
  CHECK(report->removed.empty());
  CHECK(report->kept_pinned == 3);
  CHECK(rt.replay(rec, ticket).has_value());

  // Unpinned and old: collected; replay answers blob_not_found naming the first blob.
  REQUIRE(sandbox::unpin_record(*store, rec).has_value());
  report = store->collect_garbage({});
  REQUIRE(report.has_value());
  CHECK(report->removed.size() == 3);
  auto again = rt.replay(rec, ticket);
  REQUIRE(again.has_error());
  CHECK(again.error().code == code::blob_not_found);
  CHECK(again.error().message ==
        "replay: result.stdout.blob " + result.std_out.blob + " not found");
}

TEST_CASE("replay refuses another tenant's ticket and records whose parts disagree", "[record]") {
  auto store = sandbox::make_memory_blob_store();
  auto rt = runtime_on(store);
  const auto request = py("print(42)");
  auto result = rt.run(request, make_ticket("acme"));
  REQUIRE(result.code == code::ok);
  auto rec = sandbox::make_run_record(request, make_ticket("acme"), result);

  auto other = rt.replay(rec, make_ticket("globex"));
  REQUIRE(other.has_error());
  CHECK(other.error().code == code::action_denied);
  CHECK(other.error().message.find("tenant mismatch") != std::string::npos);

  // A record edited to name another tenant finds none of the blobs (no existence oracle).
  auto moved = rec;
  moved.tenant = "globex";
  auto r = rt.replay(moved, make_ticket("globex"));
  REQUIRE(r.has_error());
  CHECK(r.error().code == code::blob_not_found);

  auto sized = rec;
  sized.result.files_out[0].bytes += 1;
  r = rt.replay(sized, make_ticket("acme"));
  REQUIRE(r.has_error());
  CHECK(r.error().code == code::invalid_request);
  CHECK(r.error().message.find("result.files_out[0].blob") != std::string::npos);

  auto renamed = rec;
  renamed.record_id = "other";
  r = rt.replay(renamed, make_ticket("acme"));
  REQUIRE(r.has_error());
  CHECK(r.error().code == code::invalid_request);
}

TEST_CASE("record decoding is strict and names the field", "[record][json]") {
  auto store = sandbox::make_memory_blob_store();
  auto rt = runtime_on(store);
  const auto request = py("print(42)");
  auto result = rt.run(request, make_ticket("acme"));
  const std::string good =
      sandbox::encode(sandbox::make_run_record(request, make_ticket("acme"), result));
  REQUIRE(sandbox::decode_run_record(good).has_value());

  auto with = [&](auto edit) {
    auto j = nlohmann::ordered_json::parse(good);
    edit(j);
    return sandbox::decode_run_record(j.dump());
  };
  struct bad_case {
    const char* what;
    std::function<void(nlohmann::ordered_json&)> edit;
    const char* message;
  };
  const std::vector<bad_case> cases = {
      {"unknown field", [](auto& j) { j["extra"] = 1; }, "run record: unknown field 'extra'"},
      {"version", [](auto& j) { j["v"] = 2; }, "run record: v: unsupported run record version 2"},
      {"no version", [](auto& j) { j.erase("v"); }, "run record: v: required field is missing"},
      {"missing tenant", [](auto& j) { j.erase("tenant"); },
       "run record: tenant: required field is missing"},
      {"tenant type", [](auto& j) { j["tenant"] = 5; }, "run record: tenant: expected a string"},
      {"tenant syntax", [](auto& j) { j["tenant"] = "../x"; },
       "run record: tenant: invalid tenant"},
      {"digest syntax", [](auto& j) { j["request_sha256"] = "abc"; },
       "run record: request_sha256: expected 64 lowercase hex digits"},
      {"digest case",
       [](auto& j) {
         std::string d = j["request_sha256"];
         d[0] = 'A';
         j["request_sha256"] = d;
       },
       "run record: request_sha256: expected 64 lowercase hex digits"},
      {"derived_from type", [](auto& j) { j["derived_from"] = {1}; },
       "run record: derived_from[0]: expected a string"},
      {"created_at", [](auto& j) { j["created_at"] = "yesterday"; },
       "run record: created_at: expected RFC 3339"},
      {"runtime mismatch", [](auto& j) { j["runtime"]["digest"] = "sha256:00"; },
       "run record: runtime: does not match result.runtime"},
      {"run id mismatch", [](auto& j) { j["record_id"] = "ffffffffffffffff"; },
       "run record: record_id: does not match result.run_id"},
      {"result field", [](auto& j) { j["result"]["stdout"]["bytes"] = "x"; },
       "run record: result.stdout.bytes: expected a non-negative integer"},
      {"result unknown", [](auto& j) { j["result"]["nope"] = true; },
       "run record: result.unknown field 'nope'"},
      {"blob id", [](auto& j) { j["result"]["files_out"][0]["blob"] = "sha256:zz"; },
       "run record: result.files_out[0].blob: invalid blob id"},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    auto r = with(c.edit);
    REQUIRE(r.has_error());
    CHECK(r.error().code == code::invalid_request);
    CHECK(r.error().message.rfind(c.message, 0) == 0);
  }
  for (std::string_view text : {"", "{", "[]", "null", "{\"v\":1,\"v\":1}"}) {
    INFO(text);
    auto r = sandbox::decode_run_record(text);
    REQUIRE(r.has_error());
    CHECK(r.error().code == code::invalid_request);
  }
}

TEMPLATE_TEST_CASE("pins keep blobs through GC; unpinned old blobs go", "[gc]", std::true_type,
                   std::false_type) {
  store_test::temp_dir dir;
  const bool on_disk = TestType::value;
  auto store = on_disk ? fs_store(dir) : sandbox::make_memory_blob_store();
  auto kept = store->put("acme", "kept").value();
  auto old = store->put("acme", "old").value();
  auto fresh = store->put("acme", "fresh").value();
  auto other = store->put("globex", "other tenant").value();
  REQUIRE(store->pin("acme", kept, "rec-1").has_value());
  REQUIRE(store->pin("acme", kept, "rec-2").has_value());
  CHECK(store->pins("acme", kept).value() == std::vector<std::string>{"rec-1", "rec-2"});
  CHECK(store->pins("acme", old).value().empty());

  sandbox::gc_options o;
  if (on_disk) {
    for (const auto& id : {kept, old}) age_blob(dir, "acme", id, std::chrono::hours(2));
    age_blob(dir, "globex", other, std::chrono::hours(2));
  } else {
    o.older_than = std::chrono::seconds(0);  // the memory store's clock cannot be aged
  }
  o.tenants = {"acme"};
  o.dry_run = true;
  auto dry = store->collect_garbage(o);
  REQUIRE(dry.has_value());
  CHECK(store->size("acme", old).has_value());  // nothing removed by a dry run
  o.dry_run = false;
  auto report = store->collect_garbage(o);
  REQUIRE(report.has_value());
  CHECK(report->removed == dry->removed);
  CHECK(store->size("acme", kept).has_value());
  CHECK(store->size("acme", old).error() == make_error_code(errc::not_found));
  CHECK(store->size("globex", other).has_value());  // not a collected tenant
  CHECK(report->kept_pinned == 1);
  if (on_disk) {
    CHECK(report->removed == std::vector<sandbox::gc_entry>{{"acme", old, 3}});
    CHECK(report->kept_recent == 1);
    CHECK(store->size("acme", fresh).has_value());
  }

  // One holder's unpin leaves the other's pin; the last unpin makes it collectable.
  REQUIRE(store->unpin("acme", kept, "rec-1").has_value());
  REQUIRE(store->unpin("acme", kept, "rec-1").has_value());  // idempotent
  o.older_than = std::chrono::seconds(0);
  REQUIRE(store->collect_garbage(o).has_value());
  CHECK(store->size("acme", kept).has_value());
  REQUIRE(store->unpin("acme", kept, "rec-2").has_value());
  REQUIRE(store->collect_garbage(o).has_value());
  CHECK(store->size("acme", kept).error() == make_error_code(errc::not_found));

  // Bad input is refused with invalid_argument / not_found, never a crash.
  CHECK(store->pin("acme", "sha256:nope", "r").error() == make_error_code(errc::invalid_argument));
  CHECK(store->pin("acme", fresh, "").error() == make_error_code(errc::invalid_argument));
  CHECK(store->pin("acme", fresh, "../x").error() == make_error_code(errc::invalid_argument));
  CHECK(store->pin("../t", fresh, "r").error() == make_error_code(errc::invalid_argument));
  CHECK(store->pin("acme", old, "r").error() == make_error_code(errc::not_found));
  CHECK(store->pin("globex", fresh, "r").error() == make_error_code(errc::not_found));
  sandbox::gc_options bad;
  bad.tenants = {"no/such"};
  CHECK(store->collect_garbage(bad).error() == make_error_code(errc::invalid_argument));
}

TEMPLATE_TEST_CASE("the size target removes the oldest eligible blobs only until under it", "[gc]",
                   std::true_type, std::false_type) {
  store_test::temp_dir dir;
  const bool on_disk = TestType::value;
  auto store = on_disk ? fs_store(dir) : sandbox::make_memory_blob_store();
  auto a = store->put("acme", std::string(100, 'a')).value();
  auto b = store->put("acme", std::string(100, 'b')).value();
  auto c = store->put("acme", std::string(100, 'c')).value();
  sandbox::gc_options o;
  if (on_disk) {
    age_blob(dir, "acme", a, std::chrono::hours(3));
    age_blob(dir, "acme", b, std::chrono::hours(2));
    age_blob(dir, "acme", c, std::chrono::hours(1) + std::chrono::minutes(1));
  } else {
    o.older_than = std::chrono::seconds(0);
  }
  o.target_tenant_bytes = 150;
  auto report = store->collect_garbage(o);
  REQUIRE(report.has_value());
  CHECK(report->removed.size() == 2);
  CHECK(report->bytes_removed == 200);
  CHECK(report->kept_by_size == 1);
  CHECK(store->usage("acme").value() == 100);
  if (on_disk) CHECK(store->size("acme", c).has_value());  // the youngest stays
}

TEST_CASE("a put racing a collection never loses the blob it returned", "[gc]") {
  store_test::temp_dir dir;
  auto store = fs_store(dir);
  sandbox::gc_options o;  // default grace: one hour
  // Old, unpinned content that is stored again while collections run: either the collection
  // removed it first and put writes it again, or put refreshed it first and the collection
  // keeps it. Either way the id put returned is there afterwards.
  for (int round = 0; round < 50; ++round) {
    const std::string content = "content " + std::to_string(round);
    auto id = store->put("acme", content).value();
    age_blob(dir, "acme", id, std::chrono::hours(2));
    std::atomic<bool> go{false};
    std::atomic<bool> collected{false};  // Catch2 assertions stay on the test's thread
    std::thread collector([&] {
      while (!go.load()) {
      }
      collected = store->collect_garbage(o).has_value();
    });
    go = true;
    auto again = store->put("acme", content);
    collector.join();
    REQUIRE(collected.load());
    REQUIRE(again.has_value());
    CHECK(*again == id);
    CHECK(store->get("acme", id).value() == content);
  }
  // Fresh blobs written while collections run are never collected (grace period).
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::thread collector([&] {
    while (!stop.load()) {
      if (!store->collect_garbage(o)) ++failures;
    }
  });
  std::vector<std::string> ids;
  for (int i = 0; i < 100; ++i)
    ids.push_back(store->put("acme", "new " + std::to_string(i)).value());
  stop = true;
  collector.join();
  CHECK(failures.load() == 0);
  for (const auto& id : ids) CHECK(store->size("acme", id).has_value());
}

TEST_CASE("stores without pins answer unsupported", "[gc]") {
  struct minimal : sandbox::blob_store {
    sandbox::result<std::string> put(std::string_view, std::string_view) override {
      return std::string();
    }
    sandbox::result<std::string> put_fd(std::string_view, int, std::uint64_t) override {
      return std::string();
    }
    sandbox::result<std::string> get(std::string_view, std::string_view) const override {
      return std::string();
    }
    sandbox::result<std::uint64_t> copy_to(std::string_view, std::string_view, int,
                                           const std::string&) const override {
      return 0;
    }
    sandbox::result<std::uint64_t> size(std::string_view, std::string_view) const override {
      return 0;
    }
    sandbox::result<void> remove(std::string_view, std::string_view) override { return {}; }
    sandbox::result<std::vector<std::string>> list(std::string_view) const override {
      return std::vector<std::string>{};
    }
    sandbox::result<std::uint64_t> usage(std::string_view) const override { return 0; }
  } m;
  const auto id = sandbox::blob_id_of("x");
  CHECK(m.pin("acme", id, "r").error() == make_error_code(errc::unsupported));
  CHECK(m.collect_garbage({}).error() == make_error_code(errc::unsupported));
}
