#!/usr/bin/env python3
"""Summarize the runs of scripts/run-all.sh as a markdown table.

    python3 scripts/table.py DIR

Reads DIR/attempted.txt (lines `NAME RANKS MODE RC [REASON...]`, RC `skipped` for a run
that was skipped) and DIR/json/NAME.RANKS.MODE.json (written by `weave run --json`), prints

    | scenario | ranks | mode | max abs err | max rel err | wall ms | result |

sorted by scenario, ranks and mode, then `ALL PASS (n runs)` or `FAILED: k of n`, writes the
same text to DIR/table.md, and exits 1 when anything failed or nothing ran. A run without
JSON fails with its exit status (124: killed by `timeout`) and the first line of its log
(DIR/logs/NAME.RANKS.MODE.log) that mentions an error; a run whose JSON says it passed
but whose exit status is not 0 fails too. Skipped runs are listed but not counted.
Standard library only.
"""

import json
import os
import sys

HEADER = "| scenario | ranks | mode | max abs err | max rel err | wall ms | result |"
RULE = "|---|---:|---|---:|---:|---:|---|"


def read_attempted(path):
    """{(name, ranks, mode): (rc, reason)} from attempted.txt (empty when it is missing)."""
    runs = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 4:
                    continue
                name, ranks, mode, rc = fields[:4]
                runs[(name, ranks, mode)] = (rc, " ".join(fields[4:]))
    except OSError:
        pass
    return runs


def read_json(json_dir):
    """{(name, ranks, mode): dict or error string} from json/NAME.RANKS.MODE.json."""
    found = {}
    try:
        names = sorted(os.listdir(json_dir))
    except OSError:
        return found
    for file_name in names:
        if not file_name.endswith(".json"):
            continue
        parts = file_name[: -len(".json")].rsplit(".", 2)
        if len(parts) != 3:
            continue
        try:
            with open(os.path.join(json_dir, file_name), encoding="utf-8") as f:
                value = json.load(f)
            if not isinstance(value, dict):
                value = "the JSON is not an object"
        except (OSError, ValueError) as e:
            value = "unreadable JSON: %s" % e
        found[tuple(parts)] = value
    return found


def number(value, fmt):
    """`value` formatted with `fmt`, or `-` when it is not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return fmt % value


def cell(text):
    """Text made safe for one markdown table cell."""
    text = " ".join(str(text).split())
    if len(text) > 120:
        text = text[:117] + "..."
    return text.replace("|", "\\|")


def first_error(log_path):
    """The first line of a run's log that mentions an error or a failed test, or None."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "error" in line.lower() or "panicked" in line or "FAILED" in line:
                    return line.strip()
    except OSError:
        pass
    return None


def verdict(rc, reason, record, mode, log_path):
    """('PASS' | 'FAIL' | 'SKIP', result text) of one run."""
    if rc == "skipped":
        return "SKIP", "SKIP" + (" (%s)" % reason if reason else "")
    if isinstance(record, str):
        return "FAIL", "FAIL (rc %s, %s)" % (rc, record)
    if record is None:
        if mode == "tests":
            if rc == "0":
                return "PASS", "PASS"
            error = first_error(log_path)
            return "FAIL", "FAIL (rc %s%s)" % (rc, ": " + error if error else "")
        if rc is None:
            return "FAIL", "FAIL (not in attempted.txt, no JSON)"
        why = "timed out" if rc in ("124", "137") else "no JSON"
        error = first_error(log_path)
        if error:
            why += ": " + error
        return "FAIL", "FAIL (rc %s, %s)" % (rc, why)
    if record.get("passed") is True and rc in ("0", None):
        return "PASS", "PASS"
    error = record.get("error")
    detail = []
    if rc not in ("0", None):
        detail.append("rc %s" % rc)
    if error:
        detail.append(str(error))
    elif record.get("passed") is not True:
        detail.append("outputs differ from the reference")
    return "FAIL", "FAIL (%s)" % ", ".join(detail)


def sort_key(key):
    name, ranks, mode = key
    return (mode != "tests", name, int(ranks) if ranks.isdigit() else -1, mode)


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: table.py DIR\n")
        return 2
    out_dir = argv[1]
    attempted = read_attempted(os.path.join(out_dir, "attempted.txt"))
    records = read_json(os.path.join(out_dir, "json"))

    lines = [HEADER, RULE]
    ran = failed = skipped = 0
    for key in sorted(set(attempted) | set(records), key=sort_key):
        name, ranks, mode = key
        rc, reason = attempted.get(key, (None, ""))
        record = records.get(key)
        if mode == "tests":
            log_path = os.path.join(out_dir, "%s.log" % name)
        else:
            log_path = os.path.join(out_dir, "logs", "%s.%s.%s.log" % key)
        kind, result = verdict(rc, reason, record, mode, log_path)
        if kind == "SKIP":
            skipped += 1
        else:
            ran += 1
            failed += kind == "FAIL"
        data = record if isinstance(record, dict) else {}
        lines.append(
            "| %s | %s | %s | %s | %s | %s | %s |"
            % (
                cell(name),
                cell(ranks),
                cell(mode),
                number(data.get("max_abs_error"), "%.3g"),
                number(data.get("max_rel_error"), "%.3g"),
                number(data.get("wall_ms"), "%.1f"),
                cell(result),
            )
        )
    lines.append("")
    if ran == 0:
        lines.append("FAILED: nothing ran (%d skipped)" % skipped)
    elif failed:
        note = " (%d skipped)" % skipped if skipped else ""
        lines.append("FAILED: %d of %d%s" % (failed, ran, note))
    else:
        note = ", %d skipped" % skipped if skipped else ""
        lines.append("ALL PASS (%d runs%s)" % (ran, note))
    text = "\n".join(lines) + "\n"
    try:
        with open(os.path.join(out_dir, "table.md"), "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        sys.stderr.write("table.py: cannot write table.md: %s\n" % e)
    sys.stdout.write(text)
    return 0 if ran and not failed else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
