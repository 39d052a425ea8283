// Image store: small OCI layouts built here (no debootstrap), hostile layers, concurrency.
#include "sandbox/image_store.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <mutex>
#include <thread>

#include "sandbox/protocol.hpp"
#include "store/image_build.hpp"
#include "store/layer_apply.hpp"
#include "store/tar_reader.hpp"
#include "unit/store/store_test_util.hpp"

namespace {

using sandbox::errc;
using sandbox::make_error_code;
using store_test::layout_builder;
using store_test::tar_builder;
using store_test::temp_dir;
namespace fs = std::filesystem;
using json = nlohmann::json;

std::shared_ptr<sandbox::image_store> open_store(const fs::path& root, bool read_only = false) {
  auto s = sandbox::open_image_store({.root = root, .read_only = read_only});
  REQUIRE(s);
  return *s;
}

// Imports a single-image layout of `layers` as `name`; returns the digest.
std::string import(sandbox::image_store& store, const fs::path& dir,
                   const std::vector<layout_builder::layer>& layers,
                   const std::string& name = "python3") {
  layout_builder lb(dir);
  lb.single(layers);
  auto d = store.import_layout(dir, name);
  REQUIRE(d);
  return *d;
}

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_mode;
}

bool exists_nofollow(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0;
}

// Runs the remaining checks with openat2 and with the fallback walk.
struct openat2_mode {
  explicit openat2_mode(bool disabled) {
    sandbox::detail::set_openat2_disabled_for_testing(disabled);
  }
  ~openat2_mode() { sandbox::detail::set_openat2_disabled_for_testing(false); }
};

}  // namespace

TEST_CASE("image store: import list current and rootfs", "[image_store]") {
  temp_dir tmp;
  auto store = open_store(tmp / "store");
  CHECK(store->list().value().empty());
  CHECK(store->current_digest("python3").error() == make_error_code(errc::not_found));

  const std::string l1 = tar_builder()
                             .dir("usr/")
                             .dir("usr/bin/")
                             .file("usr/bin/python3", "#!fake python\n", 0755)
                             .symlink("bin", "usr/bin")
                             .finish();
  const std::string l2 = tar_builder().file("etc/os-release", "ID=test\n").finish();
  const std::string digest =
      import(*store, tmp / "layout", {{.tar = l1}, {.tar = l2, .gzip = true}});
  CHECK(sandbox::is_valid_blob_id(digest));

  auto images = store->list();
  REQUIRE(images.has_value());
  REQUIRE(images->size() == 1);
  const auto& info = images->front();
  CHECK(info.name == "python3");
  CHECK(info.digest == digest);
  CHECK(info.current);
  CHECK(info.created == "2025-01-02T03:04:05Z");  // from the image's config
  json manifest =
      json::parse(store_test::read_file(tmp / "store/layout/blobs/sha256" / digest.substr(7)));
  CHECK(info.size_bytes == manifest["layers"][0]["size"].get<std::uint64_t>() +
                               manifest["layers"][1]["size"].get<std::uint64_t>());
  CHECK(manifest["layers"][1]["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip");
  CHECK(store->current_digest("python3").value() == digest);
  CHECK(store->current_digest("bad name!").error() == make_error_code(errc::invalid_argument));

  // index.json carries the documented annotations.
  json idx = json::parse(store_test::read_file(tmp / "store/layout/index.json"));
  CHECK(idx["schemaVersion"] == 2);
  const json& a = idx["manifests"][0]["annotations"];
  CHECK(a["io.agent-sandbox.runtime"] == "python3");
  CHECK(a["io.agent-sandbox.current"] == "true");
  CHECK(a["org.opencontainers.image.ref.name"] == "python3");
  CHECK(a["org.opencontainers.image.created"] == "2025-01-02T03:04:05Z");
  CHECK(store_test::read_file(tmp / "store/layout/oci-layout").find("1.0.0") != std::string::npos);

  auto root = store->rootfs(digest);
  REQUIRE(root);
  CHECK(*root == tmp / "store/rootfs" / digest.substr(7));
  CHECK(store_test::read_file(*root / "usr/bin/python3") == "#!fake python\n");
  CHECK((mode_of(*root / "usr/bin/python3") & 07777) == 0755);
  CHECK(fs::read_symlink(*root / "bin") == "usr/bin");
  CHECK(store_test::read_file(*root / "etc/os-release") == "ID=test\n");
  CHECK((mode_of(*root / "etc") & 07777) == 0755);  // implicit parent
  CHECK((mode_of(*root) & 07777) == 0755);          // no "./" entry: the root is enterable by all
  CHECK(store->verify(digest));
  CHECK(store->rootfs("sha256:" + std::string(64, '0')).error() ==
        make_error_code(errc::not_found));
  CHECK(store->rootfs("python3").error() == make_error_code(errc::invalid_argument));
}

TEST_CASE("image store: unpack once and later calls are cheap and reuse the cache",
          "[image_store]") {
  temp_dir tmp;
  auto store = open_store(tmp / "store");
  const std::string digest =
      import(*store, tmp / "layout", {{.tar = tar_builder().file("a", "A").finish()}});
  auto first = store->rootfs(digest);
  REQUIRE(first);
  store_test::write_file(*first / "marker", "still here");  // a re-unpack would drop it
  // Damage a layer blob: later rootfs() calls hash only manifest and config, so they still
  // succeed, while verify() (every blob) notices.
  json manifest =
      json::parse(store_test::read_file(tmp / "store/layout/blobs/sha256" / digest.substr(7)));
  const std::string layer = manifest["layers"][0]["digest"];
  store_test::write_file(tmp / "store/layout/blobs/sha256" / layer.substr(7), "garbage");
  auto second = store->rootfs(digest);
  REQUIRE(second);
  CHECK(*second == *first);
  CHECK(store_test::read_file(*second / "marker") == "still here");
  CHECK(store->verify(digest).error() == make_error_code(errc::digest_mismatch));
  // A damaged manifest is caught even on the cheap path.
  store_test::write_file(tmp / "store/layout/blobs/sha256" / digest.substr(7), "{}");
  CHECK(store->rootfs(digest).error() == make_error_code(errc::digest_mismatch));
}

TEST_CASE("image store: set_current rolls back and remove keeps shared blobs", "[image_store]") {
  temp_dir tmp;
  auto store = open_store(tmp / "store");
  const std::string shared = tar_builder().file("shared", "same in both").finish();
  const std::string v1 =
      import(*store, tmp / "l1", {{.tar = shared}, {.tar = tar_builder().file("v", "1").finish()}});
  const std::string v2 =
      import(*store, tmp / "l2", {{.tar = shared}, {.tar = tar_builder().file("v", "2").finish()}});
  const std::string node =
      import(*store, tmp / "l3", {{.tar = tar_builder().file("n", "node").finish()}}, "node");
  CHECK(store->current_digest("python3").value() == v2);
  CHECK(store->current_digest("node").value() == node);
  REQUIRE(store->list().value().size() == 3);

  REQUIRE(store->set_current("python3", v1));
  CHECK(store->current_digest("python3").value() == v1);
  CHECK(store->current_digest("node").value() == node);  // other runtimes untouched
  for (const auto& i : store->list().value()) {
    if (i.name == "python3") CHECK(i.current == (i.digest == v1));
  }
  json idx = json::parse(store_test::read_file(tmp / "store/layout/index.json"));
  for (const auto& d : idx["manifests"]) {
    if (d["digest"] == v2) {
      CHECK(d["annotations"]["org.opencontainers.image.ref.name"] == "python3-" + v2.substr(7, 12));
      CHECK(d["annotations"]["io.agent-sandbox.current"] == "false");
    }
  }
  CHECK(store->set_current("python3", node).error() == make_error_code(errc::not_found));
  CHECK(store->set_current("python3", "sha256:" + std::string(64, '1')).error() ==
        make_error_code(errc::not_found));
  CHECK(store->set_current("py thon", v1).error() == make_error_code(errc::invalid_argument));

  auto v2_root = store->rootfs(v2);
  REQUIRE(v2_root);
  CHECK(store->remove(v1).error() == make_error_code(errc::busy));  // current
  {
    // A sandbox using v2 (another process, as far as the store knows) holds a shared lock
    // on its unpacked root: v2 is busy until it lets go, and nothing of it is removed.
    int in_use = ::open(v2_root->c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    REQUIRE(in_use >= 0);
    REQUIRE(::flock(in_use, LOCK_SH) == 0);
    CHECK(store->remove(v2).error() == make_error_code(errc::busy));
    CHECK(fs::exists(*v2_root / "v"));
    CHECK(store->list().value().size() == 3);
    ::close(in_use);
  }
  REQUIRE(store->remove(v2));
  CHECK_FALSE(fs::exists(*v2_root));
  CHECK(store->remove(v2).error() == make_error_code(errc::not_found));
  CHECK(store->list().value().size() == 2);
  CHECK_FALSE(fs::exists(tmp / "store/layout/blobs/sha256" / v2.substr(7)));
  // v1 still works: the shared layer was kept.
  CHECK(store->verify(v1));
  auto v1_root = store->rootfs(v1);
  REQUIRE(v1_root);
  CHECK(store_test::read_file(*v1_root / "shared") == "same in both");
  CHECK(store_test::read_file(*v1_root / "v") == "1");
}

TEST_CASE("image store: an image larger than the unpack limits is refused before it is written",
          "[image_store]") {
  temp_dir tmp;
  SECTION("bytes (a gzip bomb: a small layer that expands a thousandfold)") {
    auto s = sandbox::open_image_store({.root = tmp / "store", .max_unpacked_bytes = 1 << 20});
    REQUIRE(s);
    layout_builder lb(tmp / "layout");
    lb.single(
        {{.tar =
              tar_builder().file("small", "x").file("zeros", std::string(2 << 20, '\0')).finish(),
          .gzip = true}});
    auto r = (*s)->import_layout(lb.dir(), "python3");
    CHECK(r.error() == make_error_code(errc::corrupt));
    CHECK((*s)->list().value().empty());
    CHECK(store_test::entries(tmp / "store/rootfs").empty());
  }
  SECTION("entries") {
    auto s = sandbox::open_image_store({.root = tmp / "store", .max_unpacked_entries = 3});
    REQUIRE(s);
    layout_builder lb(tmp / "layout");
    lb.single(
        {{.tar =
              tar_builder().file("a", "1").file("b", "2").file("c", "3").file("d", "4").finish()}});
    CHECK((*s)->import_layout(lb.dir(), "python3").error() == make_error_code(errc::corrupt));
    CHECK((*s)->list().value().empty());
  }
  SECTION("within the limits, the same layers import") {
    auto s = sandbox::open_image_store(
        {.root = tmp / "store", .max_unpacked_bytes = 3 << 20, .max_unpacked_entries = 4});
    REQUIRE(s);
    layout_builder lb(tmp / "layout");
    lb.single(
        {{.tar =
              tar_builder().file("a", "1").file("b", "2").file("c", "3").file("d", "4").finish()}});
    CHECK((*s)->import_layout(lb.dir(), "python3").has_value());
  }
}

TEST_CASE("image store: corrupt or mislabelled blobs are refused", "[image_store]") {
  temp_dir tmp;
  auto store = open_store(tmp / "store");

  SECTION("a layer that does not match its digest fails import") {
    layout_builder lb(tmp / "layout");
    json d = lb.image({{.tar = tar_builder().file("x", "x").finish()}});
    lb.index({d});
    json m = json::parse(store_test::read_file(lb.blob_path(d["digest"])));
    store_test::write_file(lb.blob_path(m["layers"][0]["digest"]), "not the layer");
    CHECK(store->import_layout(lb.dir(), "python3").error() ==
          make_error_code(errc::digest_mismatch));
    CHECK(store->list().value().empty());
  }
  SECTION("a layer corrupted in the store fails unpack; nothing is cached") {
    const std::string digest =
        import(*store, tmp / "layout", {{.tar = tar_builder().file("x", "x").finish()}});
    json m =
        json::parse(store_test::read_file(tmp / "store/layout/blobs/sha256" / digest.substr(7)));
    const fs::path layer =
        tmp / "store/layout/blobs/sha256" / m["layers"][0]["digest"].get<std::string>().substr(7);
    std::string bytes = store_test::read_file(layer);
    bytes[600] ^= 1;
    store_test::write_file(layer, bytes);
    // Import already unpacked it; drop the cache so the corrupt layer must be read again.
    fs::remove_all(tmp / "store/rootfs" / digest.substr(7));
    CHECK(store->rootfs(digest).error() == make_error_code(errc::digest_mismatch));
    CHECK(store_test::entries(tmp / "store/rootfs").empty());
  }
  SECTION("unknown layer media type → corrupt") {
    layout_builder lb(tmp / "layout");
    lb.single({{.tar = tar_builder().file("x", "x").finish(),
                .media_type = "application/vnd.oci.image.layer.v1.tar+zstd"}});
    CHECK(store->import_layout(lb.dir(), "python3").error() == make_error_code(errc::corrupt));
  }
  SECTION("diff_id that does not match the uncompressed layer → digest_mismatch") {
    layout_builder lb(tmp / "layout");
    // Build a manifest whose config names another layer's diff_id.
    json good = lb.image({{.tar = tar_builder().file("x", "x").finish(), .gzip = true}});
    json m = json::parse(store_test::read_file(lb.blob_path(good["digest"])));
    json config = {
        {"rootfs", {{"type", "layers"}, {"diff_ids", {store_test::sha256_id("something else")}}}}};
    m["config"] = lb.blob(config.dump(), "application/vnd.oci.image.config.v1+json");
    json d = lb.blob(m.dump(), "application/vnd.oci.image.manifest.v1+json");
    lb.index({d});
    // Refused at import (which unpacks before making anything current); nothing remains.
    CHECK(store->import_layout(lb.dir(), "python3").error() ==
          make_error_code(errc::digest_mismatch));
    CHECK(store->list().value().empty());
    CHECK(store_test::entries(tmp / "store/rootfs").empty());
  }
  SECTION("a descriptor size that lies → corrupt") {
    layout_builder lb(tmp / "layout");
    json d = lb.image({{.tar = tar_builder().file("x", "x").finish()}});
    d["size"] = d["size"].get<std::uint64_t>() + 1;
    lb.index({d});
    CHECK(store->import_layout(lb.dir(), "python3").error() == make_error_code(errc::corrupt));
  }
  SECTION("a layer whose tar is garbage → corrupt, temp dir removed") {
    layout_builder lb(tmp / "layout");
    lb.single({{.tar = std::string(2048, 'g')}});
    CHECK(store->import_layout(lb.dir(), "python3").error() == make_error_code(errc::corrupt));
    CHECK(store->list().value().empty());
    CHECK(store_test::entries(tmp / "store/rootfs").empty());
  }
  SECTION("not a layout, bad index, ref that matches nothing") {
    fs::create_directories(tmp / "empty");
    CHECK(store->import_layout(tmp / "empty", "python3").error() == make_error_code(errc::corrupt));
    CHECK(store->import_layout(tmp / "missing", "python3").error() ==
          make_error_code(errc::not_found));
    layout_builder lb(tmp / "layout");
    json d = lb.image({{.tar = tar_builder().file("x", "x").finish()}});
    d["annotations"] = {{"org.opencontainers.image.ref.name", "v1"}};
    lb.index({d});
    CHECK(store->import_layout(lb.dir(), "python3", "v2").error() ==
          make_error_code(errc::not_found));
    CHECK(store->import_layout(lb.dir(), "python3", "v1").value() == d["digest"]);
    CHECK(store->import_layout(lb.dir(), "../x").error() ==
          make_error_code(errc::invalid_argument));
    store_test::write_file(lb.dir() / "index.json", "{not json");
    CHECK(store->import_layout(lb.dir(), "python3").error() == make_error_code(errc::corrupt));
  }
  SECTION("every image of a layout must unpack, not only the one made current") {
    // The first manifest's layer escapes its root; the second is fine. Both would enter the
    // index, and set_current could later switch to the broken one.
    layout_builder lb(tmp / "layout");
    json bad = lb.image({{.tar = tar_builder().file("../evil", "x").finish()}});
    json good = lb.image({{.tar = tar_builder().file("ok", "ok").finish()}});
    lb.index({bad, good});
    CHECK_FALSE(store->import_layout(lb.dir(), "python3").has_value());
    CHECK(store->list().value().empty());
    CHECK(store_test::entries(tmp / "store/rootfs").empty());
  }
  SECTION("a 'created' time that is not RFC 3339 is not kept (it is shown by image ls)") {
    layout_builder lb(tmp / "layout");
    json d = lb.image({{.tar = tar_builder().file("x", "x").finish()}},
                      "2020-01-01T00:00:00Z\x1b[31m\n python3 sha256:FAKE current");
    d["annotations"] = {{"org.opencontainers.image.created", "2020-01-01T00:00:00Z\x1b[2J\nFAKE"}};
    lb.index({d});
    REQUIRE(store->import_layout(lb.dir(), "python3"));
    auto images = store->list().value();
    REQUIRE(images.size() == 1);
    INFO(images[0].created);
    CHECK(images[0].created.find_first_not_of("0123456789-:TZ.+") == std::string::npos);
  }
  SECTION("a damaged index.json is reported when opening the store") {
    store_test::write_file(tmp / "store/layout/index.json", R"({"schemaVersion":2})");
    CHECK(sandbox::open_image_store({.root = tmp / "store"}).error() ==
          make_error_code(errc::corrupt));
    CHECK(sandbox::open_image_store({.root = "relative"}).error() ==
          make_error_code(errc::invalid_argument));
  }
}

TEST_CASE("image store: concurrent unpackers agree on one cache entry", "[image_store]") {
  temp_dir tmp;
  auto store = open_store(tmp / "store");
  tar_builder tb;
  for (int i = 0; i < 200; ++i)
    tb.file("d" + std::to_string(i % 10) + "/f" + std::to_string(i), std::string(3000, 'x'));
  const std::string digest = import(*store, tmp / "layout", {{.tar = tb.finish(), .gzip = true}});
  // Threads of one store, and a second store instance (as another process would have).
  auto other = open_store(tmp / "store");
  std::vector<std::thread> threads;
  std::vector<std::string> paths(6);
  std::atomic<int> failures{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      auto r = (t % 2 ? other : store)->rootfs(digest);
      if (r) {
        paths[t] = r->string();
      } else {
        ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures == 0);
  for (const auto& p : paths) CHECK(p == paths[0]);
  CHECK(store_test::entries(tmp / "store/rootfs") ==
        std::vector<std::string>{digest.substr(7)});  // losers removed their temp dirs
  CHECK(store_test::read_file(fs::path(paths[0]) / "d3/f13") == std::string(3000, 'x'));
}

TEST_CASE("image store: whiteouts hide lower-layer entries", "[image_store]") {
  temp_dir tmp;
  auto store = open_store(tmp / "store");
  const std::string lower = tar_builder()
                                .file("a/x", "x")
                                .file("a/y", "y")
                                .file("b/z", "z")
                                .file("b/sub/deep", "d")
                                .file("c", "c")
                                .finish();
  const std::string upper = tar_builder()
                                .file("a/.wh.x", "")
                                .file(".wh.c", "")
                                .dir("b/")
                                .file("b/.wh..wh..opq", "")
                                .file("b/new", "n")
                                .file("a/.wh..wh.plnk", "")  // aufs metadata: ignored
                                .file(".wh.never-existed", "")
                                .finish();
  const std::string digest = import(*store, tmp / "layout", {{.tar = lower}, {.tar = upper}});
  auto root = store->rootfs(digest);
  REQUIRE(root);
  CHECK_FALSE(exists_nofollow(*root / "a/x"));
  CHECK(store_test::read_file(*root / "a/y") == "y");
  CHECK_FALSE(exists_nofollow(*root / "c"));
  CHECK_FALSE(exists_nofollow(*root / "b/z"));
  CHECK_FALSE(exists_nofollow(*root / "b/sub"));
  CHECK(store_test::read_file(*root / "b/new") == "n");
  // No whiteout file is materialized.
  CHECK_FALSE(exists_nofollow(*root / "a/.wh.x"));
  CHECK_FALSE(exists_nofollow(*root / "b/.wh..wh..opq"));
  CHECK_FALSE(exists_nofollow(*root / "a/.wh..wh.plnk"));
}

TEST_CASE("image store: hostile layers never touch anything outside the root",
          "[image_store][hostile]") {
  const bool no_openat2 = GENERATE(false, true);
  INFO("openat2 disabled: " << no_openat2);
  openat2_mode mode(no_openat2);
  temp_dir tmp;
  auto store = open_store(tmp / "store");
  const fs::path outside = tmp / "outside";
  fs::create_directories(outside);
  struct stat passwd_before {};
  REQUIRE(::stat("/etc/passwd", &passwd_before) == 0);
  const std::string passwd_content = store_test::read_file("/etc/passwd");

  auto unpack = [&](const std::vector<std::string>& layers) {
    static int n = 0;
    std::vector<layout_builder::layer> ls;
    for (const auto& l : layers) ls.push_back({.tar = l});
    // Import unpacks before the image becomes current, so a hostile layer is refused there.
    layout_builder lb(tmp / ("layout" + std::to_string(n++)));
    lb.single(ls);
    auto d = store->import_layout(lb.dir(), "hostile");
    if (!d) return std::make_pair(std::string{}, sandbox::result<fs::path>(d.error()));
    return std::make_pair(*d, store->rootfs(*d));
  };
  auto nothing_escaped = [&] {
    CHECK(store_test::entries(outside).empty());
    CHECK_FALSE(exists_nofollow(tmp / "store/escape"));
    CHECK_FALSE(exists_nofollow(tmp / "store/rootfs/escape"));
    CHECK_FALSE(exists_nofollow(tmp / "escape"));
    struct stat now {};
    REQUIRE(::stat("/etc/passwd", &now) == 0);
    CHECK(now.st_nlink == passwd_before.st_nlink);
    CHECK(now.st_mtime == passwd_before.st_mtime);
    CHECK(store_test::read_file("/etc/passwd") == passwd_content);
    // Failed unpacks leave no temp directories behind.
    for (const auto& e : store_test::entries(tmp / "store/rootfs")) CHECK(e.size() == 64);
  };

  SECTION("../ in a member name") {
    auto [d, r] = unpack({tar_builder().file("../escape", "x").finish()});
    CHECK(r.error() == make_error_code(errc::corrupt));
    auto [d2, r2] = unpack({tar_builder().file("ok/../../../escape", "x").finish()});
    CHECK(r2.error() == make_error_code(errc::corrupt));
    nothing_escaped();
  }
  SECTION("absolute member names stay inside the root") {
    const fs::path abs = outside / "abs";
    auto [d, r] = unpack({tar_builder().file(abs.string(), "inside").finish()});
    REQUIRE(r);
    CHECK(store_test::read_file(*r / abs.relative_path()) == "inside");
    nothing_escaped();
  }
  SECTION("symlink to an outside directory, then a file through it") {
    auto [d, r] =
        unpack({tar_builder().symlink("evil", outside.string()).file("evil/pwned", "x").finish()});
    CHECK(r.error() == make_error_code(errc::corrupt));
    auto [d2, r2] =
        unpack({tar_builder()
                    .symlink("evil2", "../../../../../../../../../.." + outside.string())
                    .file("evil2/pwned", "x")
                    .finish()});
    CHECK(r2.error() == make_error_code(errc::corrupt));
    nothing_escaped();
  }
  SECTION("symlink made by one layer, written through by the next") {
    auto [d, r] = unpack({tar_builder().symlink("evil", outside.string()).finish(),
                          tar_builder().file("evil/pwned", "x").finish()});
    CHECK(r.error() == make_error_code(errc::corrupt));
    auto [d2, r2] = unpack({tar_builder().symlink("up", "../../../..").finish(),
                            tar_builder().file("up/escape", "x").finish()});
    if (no_openat2) {
      CHECK(r2.error() == make_error_code(errc::corrupt));
    } else {
      // Inside the root ".." stops at the root: the file lands in <root>/escape.
      REQUIRE(r2);
      CHECK(store_test::read_file(*r2 / "escape") == "x");
    }
    nothing_escaped();
  }
  SECTION("a symlink replacing a file is not written through") {
    // The second entry for "f" must replace the link, not write to its target.
    auto [d, r] = unpack(
        {tar_builder().symlink("f", (outside / "target").string()).file("f", "content").finish()});
    REQUIRE(r);
    CHECK(store_test::read_file(*r / "f") == "content");
    CHECK_FALSE(fs::is_symlink(*r / "f"));
    nothing_escaped();
  }
  SECTION("hard link to /etc/passwd") {
    auto [d, r] = unpack({tar_builder().hardlink("passwd", "/etc/passwd").finish()});
    CHECK(r.error() == make_error_code(errc::corrupt));
    auto [d2, r2] =
        unpack({tar_builder().hardlink("passwd", "../../../../../etc/passwd").finish()});
    CHECK(r2.error() == make_error_code(errc::corrupt));
    auto [d3, r3] = unpack(
        {tar_builder().symlink("etc-link", "/etc").hardlink("passwd", "etc-link/passwd").finish()});
    CHECK(r3.error() == make_error_code(errc::corrupt));
    nothing_escaped();
  }
  SECTION("hard links inside the root work") {
    auto [d, r] = unpack({tar_builder()
                              .file("etc/passwd", "root:x:0:0\n")
                              .hardlink("copy", "/etc/passwd")
                              .finish()});
    REQUIRE(r);
    struct stat a {
    }, b{};
    REQUIRE(::stat((*r / "etc/passwd").c_str(), &a) == 0);
    REQUIRE(::stat((*r / "copy").c_str(), &b) == 0);
    CHECK(a.st_ino == b.st_ino);
    CHECK(a.st_ino != passwd_before.st_ino);
    nothing_escaped();
  }
  SECTION("device nodes and FIFOs are skipped; setuid/setgid cleared") {
    auto [d, r] = unpack(
        {tar_builder()
             .add({.name = "dev/mem", .type = '3', .mode = 0666, .devmajor = 1, .devminor = 1})
             .add({.name = "dev/sda", .type = '4', .mode = 0660, .devmajor = 8})
             .add({.name = "fifo", .type = '6', .mode = 0644})
             .file("bin/su", "suid", 04755)
             .file("bin/wall", "sgid", 02755)
             .dir("tmp", 01777)
             .dir("sgid-dir", 02775)
             .finish()});
    REQUIRE(r);
    CHECK_FALSE(exists_nofollow(*r / "dev/mem"));
    CHECK_FALSE(exists_nofollow(*r / "dev/sda"));
    CHECK_FALSE(exists_nofollow(*r / "fifo"));
    CHECK((mode_of(*r / "bin/su") & 07777) == 0755);
    CHECK((mode_of(*r / "bin/wall") & 07777) == 0755);
    CHECK((mode_of(*r / "tmp") & 07777) == 01777);  // sticky bit kept
    CHECK((mode_of(*r / "sgid-dir") & 07777) == 0775);
    nothing_escaped();
  }
}

TEST_CASE("image store: symlinked parents resolve inside the root (merged /usr)", "[image_store]") {
  temp_dir tmp;
  auto store = open_store(tmp / "store");
  const std::string digest =
      import(*store, tmp / "layout",
             {{.tar = tar_builder().dir("usr/lib/").symlink("lib", "/usr/lib").finish()},
              {.tar = tar_builder().file("lib/libx.so", "elf").finish()}});
  auto root = store->rootfs(digest);
  REQUIRE(root);
  CHECK(store_test::read_file(*root / "usr/lib/libx.so") == "elf");
  CHECK(fs::is_symlink(*root / "lib"));
}

TEST_CASE("image store: read-only stores never write", "[image_store]") {
  temp_dir tmp;
  CHECK(sandbox::open_image_store({.root = tmp / "nope", .read_only = true}).error() ==
        make_error_code(errc::not_found));
  CHECK_FALSE(fs::exists(tmp / "nope"));
  auto rw = open_store(tmp / "store");
  const std::string digest =
      import(*rw, tmp / "layout", {{.tar = tar_builder().file("f", "1").finish()}});
  auto ro = open_store(tmp / "store", /*read_only=*/true);
  const std::string index_before = store_test::read_file(tmp / "store/layout/index.json");
  CHECK(ro->current_digest("python3").value() == digest);
  CHECK(ro->list().value().size() == 1);
  CHECK(ro->verify(digest));
  // Import unpacked it; without the cache a read-only store cannot unpack it again.
  fs::remove_all(tmp / "store/rootfs" / digest.substr(7));
  CHECK(ro->rootfs(digest).error() == make_error_code(errc::permission_denied));
  CHECK(store_test::entries(tmp / "store/rootfs").empty());
  CHECK(ro->import_layout(tmp / "layout", "x").error() == make_error_code(errc::permission_denied));
  CHECK(ro->set_current("python3", digest).error() == make_error_code(errc::permission_denied));
  CHECK(ro->remove(digest).error() == make_error_code(errc::permission_denied));
  CHECK(store_test::read_file(tmp / "store/layout/index.json") == index_before);
  auto unpacked = rw->rootfs(digest);
  REQUIRE(unpacked);
  CHECK(ro->rootfs(digest).value() == *unpacked);
  // Shared read-only with unprivileged hosts: directories 0755, blobs and index 0644.
  CHECK((mode_of(tmp / "store/layout") & 0777) == 0755);
  CHECK((mode_of(tmp / "store/layout/index.json") & 0777) == 0644);
  CHECK((mode_of(tmp / "store/layout/blobs/sha256" / digest.substr(7)) & 0777) == 0644);
  CHECK((mode_of(tmp / "store/rootfs") & 0777) == 0755);
}

TEST_CASE("tar reader: PAX long names and checksums and truncation", "[image_store][tar]") {
  using sandbox::detail::tar_entry;
  using sandbox::detail::tar_step;
  struct string_source final : sandbox::detail::byte_source {
    std::string data;
    std::size_t pos = 0;
    sandbox::result<std::size_t> read(void* buf, std::size_t n) override {
      n = std::min(n, data.size() - pos);
      std::memcpy(buf, data.data() + pos, n);
      pos += n;
      return n;
    }
  };
  const std::string long_name = std::string(150, 'n') + "/" + std::string(120, 'm');
  string_source src;
  src.data = tar_builder().file(long_name, "abc").symlink("s", std::string(200, 't')).finish();
  sandbox::detail::tar_reader tar(src);
  tar_entry e;
  REQUIRE(tar.next(e).value() == tar_step::entry);
  CHECK(e.path == long_name);
  CHECK(e.size == 3);
  char buf[8];
  CHECK(tar.read_data(buf, sizeof buf).value() == 3);
  REQUIRE(tar.next(e).value() == tar_step::entry);
  CHECK(e.type == '2');
  CHECK(e.link == std::string(200, 't'));
  CHECK(tar.next(e).value() == tar_step::end);

  string_source bad;
  bad.data = tar_builder().file("x", "y").finish();
  bad.data[0] = 'z';  // checksum no longer matches
  sandbox::detail::tar_reader t2(bad);
  CHECK(t2.next(e).error() == make_error_code(errc::corrupt));

  string_source cut;
  cut.data = tar_builder().file("x", std::string(2000, 'y')).raw().substr(0, 1024);
  sandbox::detail::tar_reader t3(cut);
  REQUIRE(t3.next(e).value() == tar_step::entry);
  CHECK(t3.next(e).error() == make_error_code(errc::corrupt));

  CHECK(sandbox::detail::split_member_path("./a//b/./c/").value() ==
        std::vector<std::string>{"a", "b", "c"});
  CHECK(sandbox::detail::split_member_path("/abs").value() == std::vector<std::string>{"abs"});
  CHECK_FALSE(sandbox::detail::split_member_path("a/../b").has_value());
  CHECK_FALSE(sandbox::detail::split_member_path(std::string(256, 'x')).has_value());
}

TEST_CASE("image build: mirror from the host's apt sources", "[image_store][build]") {
  temp_dir apt;
  using sandbox::detail::find_debian_mirror;
  CHECK(find_debian_mirror("bookworm", apt / "missing") == "http://deb.debian.org/debian");
  fs::create_directories(apt / "sources.list.d");
  // Wrong suite, wrong type, missing "main", disabled, other extensions: all skipped.
  store_test::write_file(apt / "sources.list",
                         "# deb http://commented.example/debian bookworm main\n"
                         "deb-src http://src.example/debian bookworm main\n"
                         "deb http://old.example/debian bullseye main\n"
                         "deb [arch=amd64 signed-by=/k.gpg] https://docker.example/linux/debian "
                         "bookworm stable\n");
  store_test::write_file(apt / "sources.list.d/00-disabled.sources",
                         "Types: deb\nURIs: http://disabled.example/debian\nSuites: bookworm\n"
                         "Components: main\nEnabled: no\n");
  store_test::write_file(apt / "sources.list.d/10-other.sources.bak",
                         "Types: deb\nURIs: http://bak.example/debian\nSuites: bookworm\n"
                         "Components: main\n");
  store_test::write_file(apt / "sources.list.d/20-debian.sources",
                         "Types: deb\n# a comment\nURIs: http://mirror.example/debian\n"
                         "Suites: bookworm bookworm-updates\nComponents: main contrib\n"
                         "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
                         "Types: deb\nURIs: http://security.example/debian-security\n"
                         "Suites: bookworm-security\nComponents: main\n");
  store_test::write_file(apt / "sources.list.d/30-later.list",
                         "deb http://later.example/debian bookworm main\n");
  CHECK(find_debian_mirror("bookworm", apt.path()) == "http://mirror.example/debian");
  CHECK(find_debian_mirror("bookworm-security", apt.path()) ==
        "http://security.example/debian-security");
  CHECK(find_debian_mirror("bullseye", apt.path()) == "http://old.example/debian");
  CHECK(find_debian_mirror("trixie", apt.path()) == "http://deb.debian.org/debian");
  store_test::write_file(apt / "sources.list", "deb [trusted=yes] file:/srv/mirror trixie main\n");
  CHECK(find_debian_mirror("trixie", apt.path()) == "file:/srv/mirror");
}

TEST_CASE("image build: malformed specs are refused before anything runs", "[image_store][build]") {
  temp_dir tmp;
  auto store = open_store(tmp / "store");
  const auto invalid = make_error_code(errc::invalid_argument);
  auto build = [&](sandbox::debian_image_spec spec) {
    return sandbox::build_debian_image(*store, spec).error();
  };
  CHECK(build({.name = "", .packages = {"python3"}}) == invalid);
  CHECK(build({.name = "py/thon", .packages = {"python3"}}) == invalid);
  CHECK(build({.name = "python3", .packages = {"--foo"}}) == invalid);
  CHECK(build({.name = "python3", .packages = {"python3,evil"}}) == invalid);
  CHECK(build({.name = "python3", .packages = {"Python3"}}) == invalid);
  CHECK(build({.name = "python3", .packages = {"python3"}, .suite = "--arch=x"}) == invalid);
  CHECK(build({.name = "python3", .packages = {"python3"}, .suite = ""}) == invalid);
  CHECK(build({.name = "python3", .packages = {"python3"}, .mirror = "ftp://x/debian"}) == invalid);
  CHECK(build({.name = "python3", .packages = {"python3"}, .mirror = "http://x/ debian"}) ==
        invalid);
  if (::geteuid() != 0) {
    CHECK(build({.name = "python3", .packages = {"python3"}}) ==
          make_error_code(errc::permission_denied));
  }
  CHECK(store->list().value().empty());
  for (const auto& e : store_test::entries(tmp / "store")) CHECK(e.rfind(".build-", 0) != 0);
}

TEST_CASE("image build: debootstrap a python3 image (SANDBOX_TEST_DEBOOTSTRAP=1)",
          "[image_store][debootstrap]") {
  const char* enabled = std::getenv("SANDBOX_TEST_DEBOOTSTRAP");
  if (enabled == nullptr || std::string(enabled) != "1") {
    WARN("skipped: set SANDBOX_TEST_DEBOOTSTRAP=1 to run the real debootstrap build (slow)");
    return;
  }
  temp_dir tmp;
  auto store = open_store(tmp / "store");
  std::vector<std::string> logs;
  std::mutex mu;
  sandbox::debian_image_spec spec{.name = "python3", .packages = {"python3"}};
  spec.log = [&](sandbox::log_level, std::string_view line) {
    std::lock_guard lock(mu);
    logs.emplace_back(line);
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto digest = sandbox::build_debian_image(*store, spec);
  const auto secs =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - t0)
          .count();
  for (const auto& l : logs) UNSCOPED_INFO(l);
  REQUIRE(digest);
  WARN("build_debian_image(python3) took " << secs << " s");
  CHECK(store->current_digest("python3").value() == *digest);
  CHECK(store->verify(*digest));
  auto root = store->rootfs(*digest);
  REQUIRE(root);
  CHECK(fs::exists(*root / "usr/bin/python3"));
  CHECK(store_test::read_file(*root / "etc/resolv.conf") == "nameserver 127.0.0.1\n");
  CHECK(store_test::read_file(*root / "etc/hostname") == "sandbox\n");
  CHECK(store_test::entries(*root / "var/lib/apt/lists").size() <= 2);
  for (const auto& e : store_test::entries(*root / "var/cache/apt/archives")) {
    CHECK(e.find(".deb") == std::string::npos);
  }
  CHECK(store_test::entries(*root / "dev").empty());
  // The work dir is gone.
  for (const auto& e : store_test::entries(tmp / "store")) CHECK(e.rfind(".build-", 0) != 0);
}

TEST_CASE("image build: progress from debootstrap's and apt-get's own lines",
          "[image_store][image_build]") {
  struct seen {
    std::string phase;
    std::size_t done, total;
    std::string item;
    bool operator==(const seen&) const = default;
  };
  std::vector<seen> got;
  sandbox::detail::image_build_progress_parser parser([&](const sandbox::image_build_progress& p) {
    got.push_back({std::string(p.phase), p.done, p.total, std::string(p.item)});
  });
  for (std::string_view line : {
           "I: Retrieving InRelease",  // the index, not a package
           "I: Checking Release signature",
           "I: Retrieving adduser 3.134",
           "I: Validating adduser 3.134",
           "I: Retrieving apt 2.6.1",
           "I: Validating apt 2.6.1",
           "I: Extracting adduser...",
           "I: Installing core packages...",
           "I: Unpacking required packages...",  // a step, not a package
           "I: Unpacking adduser...",
           "I: Configuring required packages...",
           "I: Configuring apt...",
           "I: Base system installed successfully.",
           "W: Unpacking x...",
       }) {
    parser.debootstrap_line(line);
  }
  CHECK(got == std::vector<seen>{{"debootstrap: retrieving", 1, 0, "adduser"},
                                 {"debootstrap: validating", 1, 1, "adduser"},
                                 {"debootstrap: retrieving", 2, 0, "apt"},
                                 {"debootstrap: validating", 2, 2, "apt"},
                                 {"debootstrap: extracting", 1, 0, "adduser"},
                                 {"debootstrap: unpacking", 1, 2, "adduser"},
                                 {"debootstrap: configuring", 1, 2, "apt"}});
  got.clear();
  for (std::string_view line : {
           "Reading package lists...",
           "0 upgraded, 2 newly installed, 0 to remove and 0 not upgraded.",
           "Need to get 5,000 kB of archives.",
           "Get:1 http://deb.debian.org/debian bookworm/main amd64 libexpat1 amd64 2.5.0-1 [99.3 "
           "kB]",
           "Get:2 http://deb.debian.org/debian bookworm/main amd64 python3 amd64 3.11.2-1 [26 kB]",
           "Selecting previously unselected package libexpat1:amd64.",
           "Unpacking libexpat1:amd64 (2.5.0-1) ...",
           "Unpacking python3 (3.11.2-1) ...",
           "Setting up libexpat1:amd64 (2.5.0-1) ...",
           "Setting up python3 (3.11.2-1) ...",
           "Setting up extra (1) ...",  // more than announced: the total is dropped, not wrong
           "Get:3 not-a-url",
           "Get:4 http://deb.debian.org/debian bookworm/main Translation-en [6107 kB]",
           "Get:5 http://deb.debian.org/debian bookworm/main amd64 Packages [8787 kB]",
       }) {
    parser.apt_line(line);
  }
  CHECK(got == std::vector<seen>{{"apt-get: downloading", 1, 2, "libexpat1"},
                                 {"apt-get: downloading", 2, 2, "python3"},
                                 {"apt-get: unpacking", 1, 2, "libexpat1:amd64"},
                                 {"apt-get: unpacking", 2, 2, "python3"},
                                 {"apt-get: setting up", 1, 2, "libexpat1:amd64"},
                                 {"apt-get: setting up", 2, 2, "python3"},
                                 {"apt-get: setting up", 3, 0, "extra"}});

  // A display that throws is not called again; parsing goes on without failing.
  int calls = 0;
  sandbox::detail::image_build_progress_parser failing([&](const sandbox::image_build_progress&) {
    ++calls;
    throw std::runtime_error("terminal gone");
  });
  failing.debootstrap_line("I: Retrieving a 1");
  failing.debootstrap_line("I: Retrieving b 1");
  CHECK(calls == 1);
}
