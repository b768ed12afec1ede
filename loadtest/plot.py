"""`--plot PNG`: latency CDFs (TTFT, TPOT, ITL, E2EL) and output tokens/s over time."""
from __future__ import annotations

from collections.abc import Sequence

from loadtest.metrics import output_token_series, tpot
from loadtest.records import RequestRecord


def _cdf(ax, values_s: Sequence[float], label: str) -> None:
    values = sorted(v * 1000.0 for v in values_s)
    if values:
        ax.plot(values, [(i + 1) / len(values) for i in range(len(values))], label=label)


def plot(path: str, records: Sequence[RequestRecord], t0: float, title: str) -> None:
    """Write a two-panel PNG: latency CDFs (log ms) and throughput per second."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    done = [r for r in records if r.success]
    fig, (cdf_ax, tput_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    _cdf(cdf_ax, [r.ttft for r in done], "TTFT")
    _cdf(cdf_ax, [t for t in map(tpot, done) if t is not None], "TPOT")
    _cdf(cdf_ax, [gap for r in done for gap in r.itl], "ITL")
    _cdf(cdf_ax, [r.latency for r in done], "E2EL")
    cdf_ax.set(xscale="log", xlabel="latency (ms)", ylabel="fraction of samples",
               title="latency CDF")
    cdf_ax.grid(True, which="both", alpha=0.3)
    cdf_ax.legend()
    series = output_token_series(done, t0)
    tput_ax.step(range(len(series)), series, where="post")
    tput_ax.set(xlabel="time since start (s)", ylabel="output tokens / s",
                title="output throughput")
    tput_ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
