// output_streams at teardown: every byte the program wrote is in the capture, in order, even
// the bytes a read had already taken out of the pipe when the run began to end.
#include "core/run/stream_reader.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <catch2/catch.hpp>
#include <memory>
#include <string>

#include "sys/unique_fd.hpp"

namespace asio = boost::asio;
using sandbox::detail::output_streams;
using sandbox::detail::stream_reader;
using sandbox::detail::unique_fd;

namespace {

struct pipe_pair {
  unique_fd read, write;
};

pipe_pair make_pipe() {
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  return {unique_fd(fds[0]), unique_fd(fds[1])};
}

void write_all(int fd, const std::string& s) {
  REQUIRE(::write(fd, s.data(), s.size()) == static_cast<ssize_t>(s.size()));
}

std::string captured(stream_reader& r) { return r.capture().stored(); }

}  // namespace

TEST_CASE("output streams: teardown keeps the bytes a read already took, in order",
          "[run][streams]") {
  asio::io_context io;
  output_streams streams(asio::make_strand(io.get_executor()), 1 << 20, 256);
  auto out = make_pipe();
  auto err = make_pipe();
  auto owner = std::make_shared<int>(0);
  bool stopping = false;
  streams.assign(std::move(out.read), std::move(err.read), owner,
                 {.data = [] {},
                  .ended = [] {},
                  .stopped = [&] { return stopping; },
                  .exited = [] { return true; }},
                 false);
  const std::string first_out(8192, 'a'), first_err(5000, 'b');
  write_all(out.write.get(), first_out);
  write_all(err.write.get(), first_err);
  // The reads start and take what is in the pipes at once (Asio reads speculatively as it
  // starts a read); their handlers wait for the event loop. Then the program writes more
  // and ends: the run's teardown begins before those handlers have run, as it can on a
  // loaded host.
  streams.start();
  write_all(out.write.get(), "tail-of-stdout");
  write_all(err.write.get(), "tail-of-stderr");
  out.write.reset();
  err.write.reset();
  stopping = true;

  bool resumed = false;
  const bool at_once = streams.settled([&] { resumed = true; });
  CHECK_FALSE(at_once);  // both reads were in flight
  CHECK_FALSE(resumed);
  io.run();
  REQUIRE(resumed);
  CHECK(streams.settled([] { FAIL("resumed twice"); }));
  streams.drain_and_close();
  CHECK(captured(streams.out()) == first_out + "tail-of-stdout");
  CHECK(captured(streams.err()) == first_err + "tail-of-stderr");
  CHECK(streams.out().capture().total_bytes() == first_out.size() + 14);
  CHECK(streams.err().capture().total_bytes() == first_err.size() + 14);
}

TEST_CASE("output streams: with no read in flight, teardown goes on at once", "[run][streams]") {
  asio::io_context io;
  output_streams streams(asio::make_strand(io.get_executor()), 1 << 20, 256);
  auto out = make_pipe();
  auto err = make_pipe();
  auto owner = std::make_shared<int>(0);
  streams.assign(std::move(out.read), std::move(err.read), owner,
                 {.data = [] {},
                  .ended = [] {},
                  .stopped = [] { return true; },
                  .exited = [] { return true; }},
                 false);
  // Never started (a run that failed before its program ran): nothing in flight.
  write_all(out.write.get(), "left");
  bool resumed = false;
  CHECK(streams.settled([&] { resumed = true; }));
  io.run();
  CHECK_FALSE(resumed);
  streams.drain_and_close();
  CHECK(captured(streams.out()) == "left");
  CHECK(captured(streams.err()).empty());
}
