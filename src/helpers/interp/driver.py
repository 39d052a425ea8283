# The interpreter-session driver (sandbox/interpreter.hpp): shipped by the host on the
# interpreter's command line (python3 -I -c <this>), never read from the image. It runs
# cells one at a time in one namespace and reports each on its own copy of the session's
# stdout as frames: b"\n<nonce> <kind> <base64>\n", at most FRAME bytes each, one write()
# each (atomic on a pipe). The cell's code shares this process and can forge any frame: the
# host trusts none of them beyond its own cell (src/runtime/interpreter.cpp).
import ast, base64, builtins, io, json, os, queue, signal, sys, threading, traceback

FRAME = 4000
CHUNK = 2048
CAP_TEXT = 4096

# 1. The channel: our own descriptors for the host's frames and commands; the cell's fd 0
#    reads nothing, fd 1 and 2 go to files read back after each cell.
_out = os.dup(1)
_in = os.dup(0)
# What the channel is: a cell that closes or replaces either descriptor has taken it (the
# driver checks after each cell and exits rather than answer on a channel not its own).
_chan = {}
for _fd in (_in, _out):
    _st = os.fstat(_fd)
    _chan[_fd] = (_st.st_dev, _st.st_ino)
_null = os.open("/dev/null", os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
_tmp = os.environ.get("TMPDIR") or "/tmp"
_files = {}
for _fd, _name in ((1, ".cell-stdout"), (2, ".cell-stderr")):
    _p = os.path.join(_tmp, _name)
    _f = os.open(_p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(_f, _fd)
    os.close(_f)
    _files[_fd] = _p


class _Capped(io.RawIOBase):
    """fd 1 / fd 2 for Python-level writes: stores up to the cap, counts the rest (a print
    flood costs neither the tmpfs nor the host)."""

    def __init__(self, fd):
        self.fd, self.cap, self.total = fd, 1 << 20, 0

    def writable(self):
        return True

    def write(self, b):
        n = len(b)
        room = self.cap - self.total
        if room > 0:
            os.write(self.fd, bytes(b[:room]))
        self.total += n
        return n


_caps = {1: _Capped(1), 2: _Capped(2)}
sys.stdout = io.TextIOWrapper(io.BufferedWriter(_caps[1]), encoding="utf-8", errors="replace",
                              line_buffering=True)
sys.stderr = io.TextIOWrapper(io.BufferedWriter(_caps[2]), encoding="utf-8",
                              errors="backslashreplace", line_buffering=True)


def _send(nonce, kind, payload=b""):
    if isinstance(payload, str):
        payload = payload.encode("utf-8", "backslashreplace")
    frame = b"\n" + nonce + b" " + kind + b" " + base64.b64encode(payload) + b"\n"
    try:
        os.write(_out, frame)
    except OSError:
        os._exit(70)  # the channel is gone: nothing can be reported any more


def _send_data(nonce, kind, head, data):
    _send(nonce, kind, head)
    for i in range(0, len(data), CHUNK):
        _send(nonce, b"d", data[i:i + CHUNK])


# 2. Commands: a reader thread, so that an interrupt reaches a busy cell. An interrupt for a
#    cell that is queued but not yet running is kept (`_pending`) and raised as the cell
#    starts; SIGINT is sent only while `_running` names the cell (both under `_lock`), and
#    the driver's handler raises KeyboardInterrupt only while a cell's code runs (`_armed`).
_cells = queue.Queue()
_running = [None]
_pending = [None]
_armed = [False]
_lock = threading.Lock()
_main = threading.main_thread().ident


def _on_sigint(signum, frame):
    if _armed[0]:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, _on_sigint)


def _reader():
    buf = b""
    while True:
        try:
            chunk = os.read(_in, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            _cells.put(None)
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("op") == "int":
                n = str(msg.get("n", "")).encode()
                with _lock:
                    if _running[0] is not None and _running[0] == n:
                        signal.pthread_kill(_main, signal.SIGINT)
                    else:
                        _pending[0] = n
            elif msg.get("op") == "exec":
                _cells.put(msg)


threading.Thread(target=_reader, daemon=True).start()


class _Display:
    def __init__(self):
        self.items = []

    def __call__(self, *objs):
        for o in objs:
            for meth, mime in (("_repr_png_", "image/png"), ("_repr_svg_", "image/svg+xml"),
                               ("_repr_html_", "text/html")):
                f = getattr(o, meth, None)
                if f is None:
                    continue
                try:
                    d = f()
                except Exception:
                    continue
                if d is not None:
                    self.items.append((mime, d.encode() if isinstance(d, str) else bytes(d)))
                    break
            else:
                self.items.append(("text/plain", repr(o).encode("utf-8", "backslashreplace")))


_display = _Display()
_ns = {"__name__": "__main__", "__builtins__": builtins, "display": _display}
_seen = {}


def _output_files():
    root = os.environ.get("SANDBOX_OUTPUT_DIR")
    out = []
    if not root:
        return out
    stack = [""]
    while stack and len(out) < 1024:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel)))
        except OSError:
            continue
        for e in entries:
            name = os.path.join(rel, e.name)
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(name)
                elif e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    key = (st.st_mtime_ns, st.st_size, st.st_ino)
                    if _seen.get(name) != key:
                        _seen[name] = key
                        out.append((name, os.path.join(root, name)))
            except OSError:
                continue
    return out


def _figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    pngs = []
    try:
        for num in plt.get_fignums():
            b = io.BytesIO()
            plt.figure(num).savefig(b, format="png")
            pngs.append(b.getvalue())
        plt.close("all")
    except Exception:
        pass
    return pngs


def _summary(exc):
    tb = traceback.extract_tb(exc.__traceback__)
    tb = [f for f in tb if f.filename == "<cell>"][-3:]
    lines = traceback.format_list(tb) + traceback.format_exception_only(type(exc), exc)
    return "".join(lines)[-CAP_TEXT:]


def _run(code):
    tree = ast.parse(code, "<cell>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<cell>", "exec"), _ns)
    if last is not None:
        v = eval(compile(last, "<cell>", "eval"), _ns)
        if v is not None:
            _ns["_"] = v
            return repr(v)
    return None


def _send_streams(nonce, cap):
    """The cell's stdout and stderr (up to `cap` each) and their full sizes."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    for fd, k in ((1, b"o"), (2, b"e")):
        try:
            size = os.fstat(fd).st_size
            with open(_files[fd], "rb") as f:
                data = f.read(cap)
        except OSError:
            size, data = 0, b""
        for i in range(0, len(data), CHUNK):
            _send(nonce, k, data[i:i + CHUNK])
        _send(nonce, k.upper(), str(max(size, _caps[fd].total)))


def _check_channel():
    """Exits (the host sees the interpreter end: state lost) when a cell closed or replaced
    the channel's descriptors: what would be sent on them may not reach the host, and
    commands may not come."""
    for fd, key in _chan.items():
        try:
            st = os.fstat(fd)
        except OSError:
            os._exit(71)
        if (st.st_dev, st.st_ino) != key:
            os._exit(71)


def _cell(msg):
    nonce = str(msg.get("n", "")).encode()
    cap = int(msg.get("out_cap", 1 << 20))
    for fd in (1, 2):
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, 0)
        except OSError:
            # An earlier cell closed or replaced it: the capture file goes back in place.
            f = os.open(_files[fd], os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            if f != fd:
                os.dup2(f, fd)
                os.close(f)
        _caps[fd].cap, _caps[fd].total = cap, 0
    _display.items = []
    status, value, err = b"ok", None, None
    try:
        _armed[0] = True
        with _lock:
            _running[0] = nonce
            early = _pending[0] == nonce
            _pending[0] = None
        if early:
            raise KeyboardInterrupt  # its interrupt came before it started
        value = _run(msg.get("code", ""))
        _armed[0] = False
    except KeyboardInterrupt as e:
        status, err = b"interrupted", _summary(e)
    except SystemExit:
        # The interpreter exits with the cell: what the cell printed still goes to the host
        # (no "z": the host takes the exit from the session's end).
        _check_channel()
        _send_streams(nonce, cap)
        raise
    except BaseException as e:  # noqa: B036 - a cell's exception is its result
        status, err = b"error", _summary(e)
    finally:
        _armed[0] = False
        with _lock:
            _running[0] = None
    _check_channel()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    for kind, text in ((b"v", value), (b"x", err)):
        if text is not None:
            data = text[:CAP_TEXT + 1].encode("utf-8", "backslashreplace")
            for i in range(0, len(data), CHUNK):
                _send(nonce, kind, data[i:i + CHUNK])
    _send_streams(nonce, cap)
    for png in _figures():
        _send_data(nonce, b"p", "image/png", png)
    for mime, data in _display.items:
        _send_data(nonce, b"p", mime, data)
    for name, path in _output_files():
        try:
            with open(path, "rb") as f:
                data = f.read(64 << 20)
        except OSError:
            continue
        _send_data(nonce, b"f", name, data)
    _send(nonce, b"z", status)


while True:
    try:
        msg = _cells.get()
        if msg is None:
            os._exit(0)
        _cell(msg)
    except KeyboardInterrupt:
        continue  # an interrupt that came after its cell was done
