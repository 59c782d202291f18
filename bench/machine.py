"""What the benchmarks record about where they ran: the CPU model and the commit."""
import os
import platform
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit(short: bool = True) -> str:
    """HEAD's hash, or $MINIDL_COMMIT where set (a copy of the tree on another machine)."""
    if os.environ.get("MINIDL_COMMIT"):
        return os.environ["MINIDL_COMMIT"]
    cmd = ["git", "rev-parse"] + (["--short"] if short else []) + ["HEAD"]
    try:
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
