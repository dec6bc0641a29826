"""Grades the answer to "where is Money.allocate defined?".

The harness writes the agent's answer to .submission.txt beside this script. The answer
passes when every Python path it mentions is ledger/money.py (a workspace prefix such as
./ or /workspace/ is fine), and a line given as `path:LINE` lies inside the method. Naming
several files, or none, fails: the task is to find the place, not to list candidates.
"""

import re
import sys
from pathlib import Path

EXPECTED_PATH = "ledger/money.py"
FIRST_LINE, LAST_LINE = 71, 81  # the `def allocate` line through the method's last line
MENTION = re.compile(r"([\w./\\-]+\.py)(?::(\d+))?")


def grade(answer: str) -> tuple[bool, str]:
    mentions = MENTION.findall(answer)
    if not mentions:
        return False, "the answer names no .py file"
    for path, line in mentions:
        normalized = path.replace("\\", "/")
        if normalized != EXPECTED_PATH and not normalized.endswith("/" + EXPECTED_PATH):
            return False, f"wrong file: {path}"
        if line and not FIRST_LINE <= int(line) <= LAST_LINE:
            return False, f"line {line} is not inside the definition"
    return True, "correct"


def main() -> int:
    submission = Path(__file__).with_name(".submission.txt")
    answer = submission.read_text(encoding="utf-8", errors="replace") if submission.exists() else ""
    passed, reason = grade(answer)
    print(reason)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
