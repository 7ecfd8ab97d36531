"The measurement discipline (minillm.bench.measure): repeats in turns, ranges, peaks once a run."

import json

from minillm.bench import measure as m


def test_alternatives_take_turns_and_warmups_are_not_counted():
    calls = []
    times = m.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 3, 2)
    assert calls == ["a", "b"] * 5
    assert [len(t.values) for t in times.values()] == [3, 3]


def test_samples_report_median_and_range():
    s = m.Samples([3.0, 1.0, 2.0, 10.0])
    assert (s.median, s.low, s.high) == (2.5, 1.0, 10.0)
    assert f"{s.scaled(1e3):.0f}" == "2500 (1000-10000)"
    assert f"{s.per(10):.1f}" == "4.2 (1.0-10.0)"  # 10 / each: 3.3, 10, 5, 1
    assert s.overlaps(m.Samples([9.0, 12.0])) and not s.overlaps(m.Samples([11.0, 12.0]))


def test_peaks_are_measured_once_per_run(tmp_path, monkeypatch):
    path = tmp_path / "peaks.json"
    monkeypatch.setenv(m.PEAKS_FILE, str(path))
    monkeypatch.setattr(m, "_peaks", {})
    measured = []
    monkeypatch.setattr(m, "measure_bandwidth", lambda: measured.append("bw") or 4e10)
    monkeypatch.setattr(m, "measure_peak_flops", lambda *a: measured.append("flops") or 1e11)
    first = m.machine_peaks()
    assert measured == ["bw", "flops", "flops"] and json.loads(path.read_text()) == first
    monkeypatch.setattr(m, "_peaks", {})  # a later chapter, in a new process: reads the file
    assert m.machine_peaks() == first and len(measured) == 3
