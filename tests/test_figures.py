"""Figures: each writes a real PNG of the documented size; bad input fails loudly; many clients collapse to grey."""

import struct

import numpy as np
import pytest

from fairserve.reproduce import figures

pytestmark = pytest.mark.unit

T = np.linspace(0.0, 100.0, 21)


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    assert len(data) > 5_000
    return struct.unpack(">II", data[16:24])


def check_png(path, returned, min_height=200):
    assert returned == path and path.exists()
    width, height = png_size(path)
    assert width == round(figures.WIDTH_IN * figures.DPI)
    assert min_height <= height <= 4 * width
    return height


def per_policy(clients, policies=("fcfs", "vtc")):
    """Client i's values total about (i + 1) * len(T): later clients have more."""
    return {p: {c: (i + 1) * (1 + 0.3 * np.sin(T + k)) for i, c in enumerate(clients)} for k, p in enumerate(policies)}


def legend_labels(fig):
    return [t.get_text() for t in fig.legends[0].get_texts()]


def test_service_rate_two_clients(tmp_path):
    out = tmp_path / "sr.png"
    check_png(out, figures.service_rate(out, T, per_policy(["a", "b"], ("fcfs", "lcf", "rpm", "vtc")), "rates"))


def test_service_rate_27_clients_collapses_to_top_8_plus_grey(tmp_path):
    clients = [f"c{i:02d}" for i in range(27)]
    data = per_policy(clients)
    out = tmp_path / "real.png"
    check_png(out, figures.service_rate(out, T, data, "real workload"))
    fig = figures._per_policy_lines(T, data, "t", "y", "service_rate")
    labels = legend_labels(fig)
    assert labels == [f"c{i:02d}" for i in range(19, 27)] + ["other clients (19)"]  # largest totals win
    left, right = ({ln.get_gid(): ln.get_color() for ln in ax.lines} for ax in fig.axes)
    assert left == right and len(left) == 27  # same client, same colour in every subplot
    assert sum(ln.get_color() == figures.GREY for ln in fig.axes[0].lines) == 19


def test_colours_stable_across_subplots_with_different_clients():
    data = {"fcfs": {"b": T, "c": T}, "vtc": {"a": T, "c": T}}
    fig = figures._per_policy_lines(T, data, "t", "y", "x")
    left, right = ({ln.get_gid(): ln.get_color() for ln in ax.lines} for ax in fig.axes)
    assert left["c"] == right["c"] and len({left["b"], left["c"], right["a"]}) == 3
    assert legend_labels(fig) == ["a", "b", "c"]


def test_five_policies_wrap_into_rows(tmp_path):
    out = tmp_path / "five.png"
    height = check_png(out, figures.service_rate(out, T, per_policy(["a"], tuple("pqrst")), "five"))
    assert height > 0.6 * round(figures.WIDTH_IN * figures.DPI)


def drawn(fig):
    """Draw `fig`; return its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


@pytest.mark.parametrize(
    "make",
    [
        lambda: figures._per_policy_lines(T * 1000, per_policy(list("abcdefg"), tuple("pqrst")), "a\nb", "y", "x"),
        lambda: figures._per_policy_lines(T, {"vtc": {"a": T * 1e5}}, "one line", "y", "x"),
        lambda: figures._accumulated_figure(T, {"vtc": T * 3000}, "a\nb", 900_000.0, "y"),
        lambda: figures._tradeoff_figure(
            {"left": {"x": [("p", 0.5, 14000.0), ("q", 1.0, 300.0)]}, "right": {"x": [("r", 0.9, 9.0)]}},
            "a\nb",
            "x",
            "y",
            [(5000.0, "reference")],
            {},
        ),
    ],
)
def test_fixed_margins_hold_every_text_apart_and_inside(make):
    """The line figures are laid out in fixed margins (not measured): every text lies inside the figure, and no
    text of one kind crosses a plot or a title, label or legend of another."""
    fig = make()
    r = drawn(fig)
    shown = [ax for ax in fig.axes if ax.get_visible()]
    titles = [ax.title.get_window_extent(r) for ax in shown]
    labels = [ax.xaxis.label.get_window_extent(r) for ax in shown]
    plots = [ax.get_window_extent(r) for ax in shown]
    legends = [lg.get_window_extent(r) for lg in fig.legends]
    suptitles = [t.get_window_extent(r) for t in fig.texts if t.get_text()]
    for b in [ax.get_tightbbox(r) for ax in shown] + legends + suptitles:  # each plot with its texts, drawn
        assert b.x0 >= 0 and b.y0 >= 0 and b.x1 <= fig.bbox.width and b.y1 <= fig.bbox.height, b
    for a in titles + suptitles:
        for b in labels + legends + plots:
            assert not a.overlaps(b), (a, b)
    for a in labels:
        for b in legends + titles + plots:
            assert not a.overlaps(b), (a, b)


def test_response_time_with_nan_gaps(tmp_path):
    data = per_policy(["a", "b", "c"])
    data["vtc"]["a"][3:9] = np.nan
    data["fcfs"]["b"][:] = np.nan  # a client with no request at all
    out = tmp_path / "rt.png"
    check_png(out, figures.response_time(out, T, data, "response time"))


def test_accumulated_difference_with_bound(tmp_path):
    out = tmp_path / "acc.png"
    diffs = {"fcfs": np.cumsum(np.ones(T.size)) * 100, "vtc": np.full(T.size, 300.0)}
    check_png(out, figures.accumulated_difference(out, T, diffs, "difference", bound=1024.0))
    fig = figures._accumulated_figure(T, diffs, "difference", 1024.0, "y")
    assert legend_labels(fig) == ["fcfs", "vtc", "bound 2U = 1,024"]
    out2 = tmp_path / "sub" / "acc.png"  # parent folders are created
    check_png(out2, figures.accumulated_difference(str(out2), T, {"vtc": np.zeros(T.size)}, "no bound"))


def test_bars_grouped_and_single_series_with_reference(tmp_path):
    out = tmp_path / "bars.png"
    series = {"vtc": [100.0, 200.0, 300.0], "weighted vtc": [50.0, 300.0, 600.0]}
    check_png(out, figures.bars(out, ["a", "b", "c"], series, "service", "service (weighted tokens)"))
    out1 = tmp_path / "bars1.png"
    check_png(
        out1,
        figures.bars(
            out1,
            ["5", "10", "20"],
            {"throughput": [900.0, 1500.0, 2100.0]},
            "rpm",
            "throughput (tokens/s)",
            reference=2500.0,
            reference_label="vtc",
        ),
    )
    fig = figures._bars_figure(["5", "10"], {"throughput": [900.0, 1500.0]}, "t", "y", 2500.0, None)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["900", "1,500"]  # value labels on top of the bars
    assert ax.get_ylim()[1] >= 2500.0 and "reference = 2,500" in legend_labels(fig)


def test_bound_chart(tmp_path):
    out = tmp_path / "bound.png"
    check_png(
        out, figures.bound_chart(out, ["synthetic", "real"], [300.0, 1500.0], [2048.0, 4096.0], "bound"), min_height=150
    )
    fig = figures._bound_figure(["a", "b"], [0.0, 5000.0], [2048.0, 4096.0], "t")  # zero: linear axis
    assert fig.axes[0].get_xscale() == "linear"
    assert any("ABOVE" in label for label in legend_labels(fig))


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda p: figures.service_rate(p, T, {}, "t"), "empty dict"),
        (lambda p: figures.response_time(p, T, {}, "t"), "empty dict"),
        (lambda p: figures.response_time(p, T, {"vtc": {}}, "t"), "no clients"),
        (lambda p: figures.service_rate(p, T, {"vtc": {"a": T[:-1]}}, "t"), "shape"),
        (lambda p: figures.accumulated_difference(p, T, {}, "t"), "empty dict"),
        (lambda p: figures.bars(p, ["a"], {}, "t", "y"), "empty dict"),
        (lambda p: figures.bars(p, ["a", "b"], {"s": [1.0]}, "t", "y"), "1 values for 2 categories"),
        (lambda p: figures.bound_chart(p, [], [], [], "t"), "empty labels"),
        (lambda p: figures.bound_chart(p, ["a"], [1.0, 2.0], [3.0], "t"), "1 labels, 2 measured"),
    ],
)
def test_bad_input_raises_clear_error(tmp_path, call, message):
    out = tmp_path / "bad.png"
    with pytest.raises(ValueError, match=message):
        call(out)
    assert not out.exists()
