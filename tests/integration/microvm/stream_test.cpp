// The microvm level counts every byte of stdout and stderr: the guest agent relays the
// program's pipes to the virtio-serial ports itself and reports how many bytes each stream
// carried; the host completes the run only once its capture holds that many (bounded). Each
// case runs several times: a lost tail showed only in some runs (docs/security.md, "microVM
// level").
//
// The floods are made of 4096-byte chunks (one pipe write each, PIPE_BUF: a chunk is written
// whole or not at all), each carrying its index, so even a run killed at its deadline says
// exactly how much it wrote: the summary's tail names the last chunk.
#include <catch2/catch.hpp>
#include <cctype>
#include <string>

#include "integration/microvm/microvm_harness.hpp"

using sandbox::code;

namespace {

// Two rounds of each variant (four runs a case): the lost tail this guards against showed in
// about one run of six before the counted relay; the conformance soak's floods at microvm
// sample it too. A third round cost about 40 s of emulation per CI run.
constexpr int kRounds = 2;
constexpr std::uint64_t kChunk = 4096;

// A Python function `chunk(i)`: 4096 bytes carrying the index i ("%08d" repeated); with
// `newline` the chunk ends in "\n".
std::string chunk_fn(bool newline) {
  return newline ? "def chunk(i):\n    return (b'%08d' % i) * 511 + b'=======\\n'\n"
                 : "def chunk(i):\n    return (b'%08d' % i) * 512\n";
}

// The index of the last whole chunk in a summary's tail (-1 when there is none).
long last_chunk_index(const std::string& summary) {
  // The last run of 8 digits before the end.
  long found = -1;
  for (std::size_t i = 0; i + 8 <= summary.size(); ++i) {
    bool digits = true;
    for (std::size_t k = 0; k < 8 && digits; ++k)
      digits = std::isdigit(static_cast<unsigned char>(summary[i + k])) != 0;
    if (digits) found = std::stol(summary.substr(i, 8));
  }
  return found;
}

}  // namespace

TEST_CASE("microvm: stdout/stderr floods are counted to the byte", "[microvm][streams]") {
  const auto& policy = mvtest::rt()->policy();
  for (bool newline : {false, true}) {
    for (int round = 0; round < kRounds; ++round) {
      INFO("newline=" << newline << " round " << round);
      // 16 MiB on stdout, then 4 MiB on stderr, then exit (the soak's flood). It ends by
      // itself: under TCG on a loaded host the flood alone takes seconds.
      sandbox::run_request base;
      base.timeout = mvtest::must_finish();
      auto r = mvtest::run(chunk_fn(newline) +
                               "import sys\n"
                               "for i in range(4096): sys.stdout.buffer.write(chunk(i))\n"
                               "sys.stdout.buffer.flush()\n"
                               "for i in range(1024): sys.stderr.buffer.write(chunk(i))\n"
                               "sys.stderr.buffer.flush()\n",
                           base);
      REQUIRE(r.code == code::ok);
      CHECK(r.exit_code == 0);
      CHECK(r.std_out.total_bytes == 16ULL << 20);
      CHECK(r.std_err.total_bytes == 4ULL << 20);
      // The caps still hold: the first `stream_capture_bytes` kept, the rest counted.
      CHECK(r.std_out.truncated);
      CHECK(r.std_out.bytes == policy.stream_capture_bytes);
      CHECK(r.std_err.truncated);
      CHECK(r.std_err.bytes == policy.stream_capture_bytes);
      CHECK(last_chunk_index(r.std_out.summary) == 4095);
      CHECK(last_chunk_index(r.std_err.summary) == 1023);
    }
  }
}

TEST_CASE("microvm: a child writing after its parent exited is counted until it is killed",
          "[microvm][streams]") {
  // The child writes chunks to both streams without end and notes after each pair how many
  // pairs it wrote (an output file, collected after the kill). Its parent waits for the first
  // note, then either exits — the host's exit grace ends the run, the guest kills the child
  // mid-flood (`finish`) — or waits too, and the deadline ends the run.
  for (bool parent_exits : {true, false}) {
    for (int round = 0; round < kRounds; ++round) {
      INFO("parent exits: " << parent_exits << ", round " << round);
      sandbox::run_request base;
      // Start-up, the fork and the child's first chunks, then seconds of flooding.
      base.timeout = mvtest::deadline(std::chrono::seconds(2));
      auto r = mvtest::run(chunk_fn(false) +
                               "import os, time\n"
                               "p = os.environ['SANDBOX_OUTPUT_DIR'] + '/n'\n"
                               "if os.fork() == 0:\n"
                               "    n = os.open(p, os.O_WRONLY | os.O_CREAT)\n"
                               "    i = 0\n"
                               "    while True:\n"
                               "        os.write(1, chunk(i))\n"
                               "        os.write(2, chunk(i))\n"
                               "        i += 1\n"
                               "        os.pwrite(n, b'%08d' % i, 0)\n"
                               "while not (os.path.exists(p) and os.path.getsize(p) == 8):\n"
                               "    time.sleep(0.01)\n" +
                               (parent_exits ? "os._exit(0)\n" : "while True: time.sleep(1)\n"),
                           base);
      CHECK(r.code == (parent_exits ? code::ok : code::timeout));
      // Whatever the child wrote, every byte was counted: whole chunks, and the last one the
      // tail shows is the count's last.
      INFO("stdout " << r.std_out.total_bytes << " stderr " << r.std_err.total_bytes);
      CHECK(r.std_out.total_bytes % kChunk == 0);
      CHECK(r.std_err.total_bytes % kChunk == 0);
      REQUIRE(r.std_out.total_bytes > 0);
      REQUIRE(r.std_err.total_bytes > 0);
      CHECK(last_chunk_index(r.std_out.summary) ==
            static_cast<long>(r.std_out.total_bytes / kChunk) - 1);
      CHECK(last_chunk_index(r.std_err.summary) ==
            static_cast<long>(r.std_err.total_bytes / kChunk) - 1);
      // What the child wrote, as it noted after each pair of chunks (the kill may fall between
      // a write and its note): that many pairs, or one chunk more on either stream.
      REQUIRE(r.files_out.size() == 1);
      const std::string noted = mvtest::blob(r.files_out[0].blob);
      REQUIRE(noted.size() == 8);
      const std::uint64_t pairs = std::stoull(noted);
      INFO("pairs noted " << pairs);
      CHECK(r.std_out.total_bytes >= pairs * kChunk);
      CHECK(r.std_out.total_bytes <= (pairs + 1) * kChunk);
      CHECK(r.std_err.total_bytes >= pairs * kChunk);
      CHECK(r.std_err.total_bytes <= (pairs + 1) * kChunk);
      // Stdout is written before stderr in each pair: stdout is at most one chunk ahead.
      CHECK(r.std_out.total_bytes >= r.std_err.total_bytes);
      CHECK(r.std_out.total_bytes <= r.std_err.total_bytes + kChunk);
      CHECK(mvtest::vmm_processes() == 0);
    }
  }
}
