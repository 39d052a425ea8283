#!/usr/bin/env python3
"""The freight-quote walkthrough through `sandboxctl serve` (service mode).

An agent process that does not link the library asks the host's daemon to run two snippets a
model wrote:

  1. put the rate table (CSV) and the shipment (JSON) into the blob store of tenant "acme",
  2. run the quote snippet with both as input files; it prints a summary and writes
     quote.json, which is then fetched back from the blob store by its blob id,
  3. run the live-rates snippet, which tries to reach an HTTPS API: the ticket grants no
     network, so it ends `network_disabled` with the refused DNS lookup listed.

Exit status: 0 when run 1 ended ok with the expected quote and run 2 ended network_disabled;
1 otherwise (or when the daemon cannot be reached); 2 for bad arguments.

    sudo build/dev/bin/sandboxctl serve --socket /tmp/sandbox.sock &
    sudo /usr/bin/python3 examples/python_client/freight_via_daemon.py --socket /tmp/sandbox.sock
"""

import argparse
import json
import os
import sys

# The package in the source tree, unless it is installed (clients/python).
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "clients", "python", "src"))
from agent_sandbox import (Client, FilesOut, InputFile, RunRequest, SandboxError,  # noqa: E402
                           Ticket)

TENANT = "acme"

# The host decides what runs: code.execute for tenant acme, process isolation, no network.
# The daemon trusts tickets from whoever can open its socket (mode 0660).
TICKET = Ticket(id="freight-quote-1", tenant=TENANT, actions=["code.execute"],
                isolation="process", max_timeout_ms=8000, max_memory_bytes=536870912)

RATE_TABLE_CSV = (
    "origin,destination,mode,min_kg,max_kg,rate_usd_per_kg,base_fee_usd,volumetric_kg_per_m3,"
    "fuel_surcharge_pct,transit_days\n"
    "NLRTM,USCHI,ocean,0,1000,0.92,180.00,1000,12,24\n"
    "NLRTM,USCHI,ocean,1000,,0.71,180.00,1000,12,24\n"
    "NLRTM,USCHI,air,0,500,4.10,95.00,167,18,4\n"
    "NLRTM,USCHI,air,500,,3.45,95.00,167,18,4\n"
    "DEHAM,USNYC,ocean,0,1000,0.85,160.00,1000,12,18\n"
    "DEHAM,USNYC,ocean,1000,,0.66,160.00,1000,12,18\n"
    "DEHAM,USNYC,air,0,,3.90,90.00,167,18,3\n")

SHIPMENT_JSON = ('{"reference":"PO-7781","origin":"NLRTM","destination":"USCHI",'
                 '"weight_kg":1240,"volume_m3":"4.2","deliver_within_days":30}')

# Ocean: chargeable 4200 kg at 0.71 + 180.00 base + 12 % fuel = 3541.44 (cheaper than air).
EXPECTED_MODE, EXPECTED_TOTAL = "ocean", "3541.44"

QUOTE_SNIPPET = r'''import csv, json, os, sys
from decimal import Decimal, ROUND_CEILING, ROUND_HALF_UP

inp, out = os.environ["SANDBOX_INPUT_DIR"], os.environ["SANDBOX_OUTPUT_DIR"]
with open(os.path.join(inp, "shipment.json")) as f:
    shipment = json.load(f)
with open(os.path.join(inp, "rates.csv"), newline="") as f:
    rows = list(csv.DictReader(f))

CENT = Decimal("0.01")
weight = Decimal(shipment["weight_kg"])
volume = Decimal(shipment["volume_m3"])
lane = (shipment["origin"], shipment["destination"])

def price(mode):
    brackets = [r for r in rows if (r["origin"], r["destination"], r["mode"]) == lane + (mode,)]
    if not brackets:
        return None
    volumetric = (volume * Decimal(brackets[0]["volumetric_kg_per_m3"])).to_integral_value(ROUND_CEILING)
    chargeable = max(weight, volumetric)
    for r in brackets:
        if Decimal(r["min_kg"]) <= chargeable and (not r["max_kg"] or chargeable < Decimal(r["max_kg"])):
            break
    else:
        return None
    freight = (chargeable * Decimal(r["rate_usd_per_kg"])).quantize(CENT, ROUND_HALF_UP)
    base = Decimal(r["base_fee_usd"]).quantize(CENT)
    fuel = ((freight + base) * Decimal(r["fuel_surcharge_pct"]) / 100).quantize(CENT, ROUND_HALF_UP)
    return {"mode": mode, "chargeable_kg": str(chargeable), "rate_usd_per_kg": r["rate_usd_per_kg"],
            "freight_usd": str(freight), "base_fee_usd": str(base), "fuel_surcharge_usd": str(fuel),
            "total_usd": str(freight + base + fuel), "transit_days": int(r["transit_days"])}

options = [q for q in map(price, sorted({r["mode"] for r in rows})) if q]
in_time = [q for q in options if q["transit_days"] <= shipment["deliver_within_days"]]
if not in_time:
    sys.exit(f"no service on {lane[0]}-{lane[1]} arrives within {shipment['deliver_within_days']} days")
best = min(in_time, key=lambda q: Decimal(q["total_usd"]))
quote = {"reference": shipment["reference"], "lane": f"{lane[0]}-{lane[1]}", "currency": "USD",
         "selected": best, "alternatives": [q for q in options if q is not best]}
with open(os.path.join(out, "quote.json"), "w") as f:
    json.dump(quote, f, indent=2)
print(f"{quote['reference']} {quote['lane']}: {best['mode']}, {best['chargeable_kg']} kg chargeable, "
      f"USD {best['total_usd']}, {best['transit_days']} days")
for q in quote["alternatives"]:
    print(f"  alternative: {q['mode']}, USD {q['total_usd']}, {q['transit_days']} days")
'''

LIVE_RATES_SNIPPET = '''import json, urllib.request
with urllib.request.urlopen("https://api.freight-rates.example/v1/live", timeout=5) as r:
    print(json.load(r))
'''


def indent(text, prefix="    "):
    return "".join(prefix + line + "\n" for line in text.rstrip("\n").split("\n")) if text else ""


def print_head(title, r):
    print(f"\n== {title}")
    print(f"  code:      {r.code}" + (f" ({r.message})" if r.message else ""))
    if r.exit_code is not None:
        print(f"  exit code: {r.exit_code}")
    print(f"  runtime:   {r.runtime.name} {r.runtime.digest} "
          f"({r.isolation} isolation, run {r.run_id})")
    print(f"  usage:     queue {r.queue_wait_ms} ms, setup {r.usage.setup_ms} ms, "
          f"wall {r.usage.wall_ms} ms, cpu {r.usage.cpu_ms} ms")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", required=True, help="the daemon's unix socket")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait per answer")
    args = parser.parse_args()

    failures = []

    def expect(ok, what):
        if not ok:
            print(f"  CHECK FAILED: {what}")
            failures.append(what)

    try:
        client = Client(args.socket)
    except OSError as e:
        print(f"cannot connect to the sandbox daemon at {args.socket}: {e}")
        return 1
    with client as sb:
        try:
            # 1. Inputs go in as blobs of the ticket's tenant; requests name only blob ids.
            rates = sb.put_blob(TENANT, RATE_TABLE_CSV.encode(), timeout=args.timeout)
            shipment = sb.put_blob(TENANT, SHIPMENT_JSON.encode(), timeout=args.timeout)
            print(f"inputs:  rates.csv {rates}\n         shipment.json {shipment}")

            # 2. The quote.
            quote_request = RunRequest(runtime="python3", source=QUOTE_SNIPPET, timeout_ms=5000,
                                       files_in=[InputFile("rates.csv", rates),
                                                 InputFile("shipment.json", shipment)],
                                       files_out=FilesOut(max_files=4, max_bytes=65536))
            q = sb.run(TICKET, quote_request, timeout=args.timeout)
            print_head("run 1: price the shipment from the rate table", q)
            print("  stdout:\n" + indent(q.stdout.summary), end="")
            if q.stderr.summary:
                print("  stderr:\n" + indent(q.stderr.summary), end="")
            quote_doc = None
            for f in q.files_out:
                print(f"  output:    {f.name} {f.blob} ({f.bytes} bytes)")
                if f.name == "quote.json":
                    data = sb.get_blob(TENANT, f.blob, timeout=args.timeout)  # by blob id
                    print("  quote.json (from the blob store):\n" + indent(data.decode()), end="")
                    quote_doc = json.loads(data)
            expect(q.code == "ok", "run 1 ended ok")
            expect(q.exit_code == 0, "run 1 exited 0")
            expect(isinstance(quote_doc, dict), "run 1 wrote quote.json holding a JSON object")
            if isinstance(quote_doc, dict):
                selected = quote_doc.get("selected", {})
                expect(selected.get("mode") == EXPECTED_MODE, f"quote.json selects {EXPECTED_MODE}")
                expect(selected.get("total_usd") == EXPECTED_TOTAL,
                       f"quote.json totals USD {EXPECTED_TOTAL}")

            # 3. Live rates, without network.
            live = sb.run(TICKET, RunRequest(runtime="python3", source=LIVE_RATES_SNIPPET,
                                             timeout_ms=5000), timeout=args.timeout)
            print_head("run 2: fetch live rates (the ticket grants no network)", live)
            err = live.stderr.summary.rstrip("\n")
            print(f"  stderr (last line of {live.stderr.total_bytes} bytes):\n"
                  + indent(err.rsplit("\n", 1)[-1]), end="")
            dns_listed = False
            for e in live.egress_attempts:
                print(f"  egress:    {e.protocol} {e.host or e.address} "
                      f"port {e.port}, {'allowed' if e.allowed else 'refused'} ({e.reason})")
                if e.protocol == "dns" and e.host == "api.freight-rates.example" and not e.allowed:
                    dns_listed = True
            expect(live.code == "network_disabled", "run 2 ended network_disabled")
            expect(dns_listed, "run 2 lists the refused DNS lookup of api.freight-rates.example")
        except (SandboxError, ConnectionError, TimeoutError) as e:
            print(f"the sandbox daemon failed: {type(e).__name__}: {e}")
            return 1

    if failures:
        print(f"\n{len(failures)} check(s) failed")
        return 1
    print(f"\nquote: {EXPECTED_MODE}, USD {EXPECTED_TOTAL}; live rates: network_disabled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
