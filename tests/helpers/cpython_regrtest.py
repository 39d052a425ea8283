# Runs CPython's own regression tests (Debian's libpython3.11-testsuite) module by module and
# prints one JSON line per module: its exit status, seconds, and the ids of the cases that
# failed and that were skipped (from regrtest's JUnit XML). The same file runs inside the
# sandbox and outside it (tests/integration/process/cpython_compat_test.cpp), which prepends
#   MODULES = [["test_os"], ["test_io", "-m", "test_large_file_ops"], ...]
#   WORKERS = 3
# (each entry: the module, then extra regrtest arguments). Only the standard library is used.
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET


def run_module(entry):
    module, extra = entry[0], list(entry[1:])
    work = tempfile.mkdtemp(prefix='regrtest-')
    xml = os.path.join(work, 'junit.xml')
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, '-m', 'test', '--timeout', '300', '--junit-xml', xml, module] + extra,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=work,
            timeout=400)
        status, output = done.returncode, done.stdout.decode(errors='replace')
    except subprocess.TimeoutExpired as e:
        status, output = 'timeout', (e.stdout or b'').decode(errors='replace')
    failed, skipped, cases = [], [], 0
    try:
        for case in ET.parse(xml).iter('testcase'):
            cases += 1
            name = case.get('name', '')
            if case.find('failure') is not None or case.find('error') is not None:
                failed.append(name)
            elif case.find('skipped') is not None:
                skipped.append(name)
    except (OSError, ET.ParseError):
        pass  # no XML: the module did not get to run (status says how it ended)
    return {'module': module, 'status': status, 'seconds': round(time.monotonic() - start, 1),
            'cases': cases, 'failed': sorted(failed), 'skipped': sorted(skipped),
            'tail': output[-2000:] if failed or status != 0 else ''}


with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:  # noqa: F821 (prepended)
    for result in pool.map(run_module, MODULES):  # noqa: F821 (prepended)
        print(json.dumps(result), flush=True)
