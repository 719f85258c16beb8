"""A tiny command hook: append the event name and the JSON it got on stdin to a log file.

Usage: ``python recorder.py LOG EVENT``. It prints nothing and exits 0, so every CLI treats
it as an allowing no-op; only what the CLI sent is observed.
"""

import json
import sys

if __name__ == "__main__":
    log, event = sys.argv[1], sys.argv[2]
    raw = sys.stdin.read()
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = {"_unparsed": raw}
    with open(log, "a", encoding="utf-8") as out:
        out.write(json.dumps({"event": event, "payload": payload}) + "\n")
