"""scripts/gpu_suite.sh on CPU: it installs the kit's wheels where the steps import them,
keeps every step's exit code and full log under $OUT, and fails loudly. The kernel bench
step needs CUDA, so here it is the failing step."""
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_suite.sh"


def fake_kit(root: Path, requires: str = "pytest>=1", extra: dict | None = None) -> Path:
    """A kit of one pure-python wheel (module kitprobe, and the `extra` files) and no
    tokenizer."""
    wheels = root / "wheels"
    wheels.mkdir(parents=True)
    info = "kitprobe-0.1.dist-info"
    with zipfile.ZipFile(wheels / "kitprobe-0.1-py3-none-any.whl", "w") as whl:
        whl.writestr("kitprobe.py", "ANSWER = 42\n")
        for name, text in (extra or {}).items():
            whl.writestr(name, text)
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: kitprobe\nVersion: 0.1\n"
                                        f"Requires-Dist: {requires}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                      "Root-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return root


def run(tmp: Path, *args: str, kit: Path, **extra_env: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(tmp / "out"),
           "GPU_KIT": str(kit), "GPU_KIT_SITE": str(tmp / "site"), "HOME": str(tmp),
           **extra_env}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_failing_step_fails_the_script_and_keeps_its_log(tmp_path):
    done = run(tmp_path, "kernels", kit=fake_kit(tmp_path / "kit"))
    assert done.returncode == 1
    out = tmp_path / "out"
    assert "needs a CUDA GPU" in (out / "kernels_bench.log").read_text()
    summary = (out / "summary.txt").read_text().splitlines()
    bench = next(line for line in summary if line.startswith("kernels_bench: exit "))
    assert bench != "kernels_bench: exit 0"
    assert summary[-1].startswith("FAILED: ") and "kernels_bench" in summary[-1]
    assert (tmp_path / "site" / "kitprobe.py").is_file()  # the kit was installed
    assert "kit requirements met" in (out / "device.log").read_text()


def test_a_kit_wheel_needing_a_newer_package_than_installed_is_reported(tmp_path):
    run(tmp_path, "kernels", kit=fake_kit(tmp_path / "kit", requires="pytest>=999"))
    log = (tmp_path / "out" / "device.log").read_text()
    assert "kitprobe needs pytest>=999, found" in log


def test_all_keeps_to_its_budget_and_names_each_step_it_did_not_start(tmp_path):
    started = time.monotonic()
    done = run(tmp_path, "all", kit=fake_kit(tmp_path / "kit"), SUITE_BUDGET_S="40")
    assert time.monotonic() - started < 40
    assert done.returncode == 1
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert summary[0].startswith("device: exit ")  # 1 here: no nvidia-smi
    not_started = [line.split(":")[0] for line in summary if "not started" in line]
    assert not_started == ["gpu_tests", "bench_llama-3.2-1b", "kernels_bench",
                           "bench_smollm2-135m", "compare", "cuda_small"]
    assert summary[-1] == "FAILED: device " + " ".join(not_started)


def test_a_step_past_the_budget_is_stopped_and_the_next_not_started(tmp_path):
    """tests with a budget of 30 s: gpu_tests gets what is left after the device step
    (about 5 s here, so up to 4x slower still leaves it the 4 s a step needs to start)
    less a 3 s reserve, and the kit (ahead of the venv on the path) brings a pytest that
    never ends."""
    kit = fake_kit(tmp_path / "kit", extra={"pytest/__init__.py": "",
                                            "pytest/__main__.py": "import time\n"
                                                                  "time.sleep(600)\n"})
    started = time.monotonic()
    done = run(tmp_path, "tests", kit=kit, SUITE_BUDGET_S="30", SUITE_RESERVE_S="3",
               SUITE_MIN_STEP_S="4")
    assert time.monotonic() - started < 30
    assert done.returncode == 1
    summary = (tmp_path / "out" / "summary.txt").read_text().splitlines()
    assert summary[1].startswith("gpu_tests: stopped at the budget after ")
    assert summary[2].startswith("cuda_small: not started")
    assert summary[-1] == "FAILED: device gpu_tests cuda_small"  # device: no nvidia-smi


def test_refuses_to_run_without_a_kit_or_with_an_unknown_step(tmp_path):
    empty = tmp_path / "no_kit"
    (empty / "wheels").mkdir(parents=True)
    done = run(tmp_path, "tests", kit=empty)
    assert done.returncode == 1 and "build the kit first" in done.stderr
    done = run(tmp_path, "warmup", kit=fake_kit(tmp_path / "kit"))
    assert done.returncode == 2 and "unknown step set" in done.stderr
