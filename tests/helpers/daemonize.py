# Hostile helper: leaves a daemon behind — double fork, setsid, SIGTERM/SIGHUP ignored, every
# descriptor closed — then returns to the caller's code in the original process.
import os, signal, time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        os.closerange(0, 1024)
        while True:
            time.sleep(0.05)
    os._exit(0)
os.wait()
