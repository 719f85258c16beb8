"""A tiny command hook: append the event name and the JSON it got on stdin to a log file.

Usage: ``python recorder.py LOG EVENT``. By default it prints nothing and exits 0, so every CLI
treats it as an allowing no-op. A test can script an answer per event in ``LOG.answers.json``
(``{"EVENT": {"exit": 2, "stdout": "...", "stderr": "..."}}``) to see how the CLI obeys it.
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
    try:
        with open(log + ".answers.json", encoding="utf-8") as scripted:
            answer = json.load(scripted).get(event, {})
    except FileNotFoundError:
        answer = {}
    sys.stdout.write(answer.get("stdout", ""))
    sys.stderr.write(answer.get("stderr", ""))
    sys.exit(answer.get("exit", 0))
