//! PNG plots of a report: latency bars per operation and configuration (one
//! chart per suite that measured latencies), and throughput against threads
//! for every scaling series. Drawn with plotters' bitmap backend and a
//! DejaVu font from Debian's fonts-dejavu-core, read at run time.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::{Figure, Report, SuiteResult};

const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];
const FONT: &str = "sans-serif";

fn font() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let bytes = FONT_PATHS
                .iter()
                .find_map(|p| std::fs::read(p).ok())
                .ok_or_else(|| format!("no DejaVuSans.ttf in {FONT_PATHS:?} (apt-get install fonts-dejavu-core)"))?;
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FONT, FontStyle::Normal, bytes)
                .map_err(|_| "DejaVuSans.ttf is not a usable font".to_string())
        })
        .clone()
}

fn err(e: impl std::fmt::Display) -> String {
    format!("plot: {e}")
}

/// Draws every plot of `report` under `out/plots`; returns the paths
/// relative to `out`.
pub fn draw(report: &Report, out: &Path) -> Result<Vec<String>, String> {
    font()?;
    let dir = out.join("plots");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut made = Vec::new();
    for suite in &report.suites {
        // Rows of whole programs, in ms and µs alike: their times relative
        // to native share one axis.
        if suite.suite == "programs" {
            let name = "plots/programs-ratio.png".to_string();
            if ratio_bars(suite, &out.join(&name))? {
                made.push(name);
            }
            continue;
        }
        let name = format!("plots/{}-latency.png", suite.suite);
        if latency_bars(suite, &out.join(&name))? {
            made.push(name);
        }
        for series in series_of(suite) {
            let name = format!("plots/{}-{}.png", suite.suite, series);
            scaling(suite, &series, &out.join(&name))?;
            made.push(name);
        }
    }
    Ok(made)
}

fn ran(suite: &SuiteResult) -> impl Iterator<Item = &crate::report::ConfigResult> {
    suite
        .results
        .iter()
        .filter(|r| r.error.is_none() && !r.figures.is_empty())
}

fn is_latency(f: &Figure) -> bool {
    f.unit == "us" && f.series.is_none() && f.error.is_none()
}

fn series_of(suite: &SuiteResult) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in ran(suite) {
        for f in &r.figures {
            if let Some(s) = &f.series {
                if !out.contains(s) {
                    out.push(s.clone());
                }
            }
        }
    }
    out
}

/// Horizontal bars, one group per operation, one bar per configuration, on a
/// log axis (latencies here span 1 µs to milliseconds). Returns whether the
/// suite had latencies to draw.
fn latency_bars(suite: &SuiteResult, path: &PathBuf) -> Result<bool, String> {
    // Only configurations with latencies get a bar and a legend entry (in
    // `transport`, only the null ones have any).
    let configs: Vec<_> = ran(suite).filter(|r| r.figures.iter().any(is_latency)).collect();
    let mut ops: Vec<String> = Vec::new();
    for r in &configs {
        for f in r.figures.iter().filter(|f| is_latency(f)) {
            if !ops.contains(&f.op) {
                ops.push(f.op.clone());
            }
        }
    }
    let values: Vec<f64> = configs
        .iter()
        .flat_map(|r| r.figures.iter().filter(|f| is_latency(f)).map(|f| f.value))
        .filter(|v| *v > 0.0 && v.is_finite())
        .collect();
    if ops.is_empty() || values.is_empty() {
        return Ok(false);
    }
    let lo = values.iter().cloned().fold(f64::INFINITY, f64::min).max(1e-3) / 2.0;
    let hi = values.iter().cloned().fold(0.0, f64::max).max(lo * 4.0) * 2.0;
    let bars = configs
        .iter()
        .map(|r| {
            let values = ops
                .iter()
                .map(|op| {
                    r.figures
                        .iter()
                        .find(|f| &f.op == op && is_latency(f))
                        .map(|f| (f.value, None))
                })
                .collect();
            (r.config.clone(), values)
        })
        .collect();
    Bars {
        caption: format!("{}: latency per operation (µs, log scale)", suite.suite),
        x_desc: "µs",
        ops,
        range: (lo, hi),
        configs: bars,
        reference: None,
    }
    .draw(path)?;
    Ok(true)
}

/// Per operation: a bar's value and its whisker's (low, high), if any.
type BarValues = Vec<Option<(f64, Option<(f64, f64)>)>>;

/// Draws the legend at `at` and writes the picture.
fn legend_and_present<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    at: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(at)
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    chart.plotting_area().present().map_err(err)
}

/// A chart of horizontal bars on a log axis: one group per operation, one
/// bar per configuration, each with an optional whisker.
struct Bars {
    caption: String,
    x_desc: &'static str,
    ops: Vec<String>,
    /// The axis, (low, high).
    range: (f64, f64),
    /// Per configuration, per operation: the bar's value and the whisker's
    /// (low, high), if any.
    configs: Vec<(String, BarValues)>,
    /// Where to draw a vertical line (1 for ratios).
    reference: Option<f64>,
}

impl Bars {
    fn draw(&self, path: &PathBuf) -> Result<(), String> {
        let (lo, hi) = self.range;
        let ops = &self.ops;
        let label_len = ops.iter().map(|o| o.len()).max().unwrap_or(4) as u32;
        let row = (self.configs.len() as u32 * 14 + 14).max(34);
        let height = 130 + row * ops.len() as u32 + 22 * self.configs.len() as u32;
        let root = BitMapBackend::new(path, (1100, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let n = ops.len() as f64;
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.caption, (FONT, 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(30 + label_len * 9)
            .build_cartesian_2d((lo..hi).log_scale(), -0.5..n - 0.5)
            .map_err(err)?;
        let label = |y: &f64| {
            let i = y.round();
            if (y - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < ops.len() {
                ops[ops.len() - 1 - i as usize].clone()
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .y_labels(ops.len() * 2 + 1)
            .y_label_formatter(&label)
            .x_desc(self.x_desc)
            .label_style((FONT, 15))
            .disable_y_mesh()
            .draw()
            .map_err(err)?;
        let band = 0.8 / self.configs.len() as f64;
        for (c, (name, values)) in self.configs.iter().enumerate() {
            let color = Palette99::pick(c).to_rgba();
            let mut bars = Vec::new();
            let mut whiskers = Vec::new();
            for (i, v) in values.iter().enumerate() {
                let Some((value, whisker)) = *v else { continue };
                let y = (ops.len() - 1 - i) as f64 + 0.4 - band * c as f64;
                bars.push(Rectangle::new(
                    [(lo, y - band), (value.max(lo), y - band * 0.15)],
                    color.filled(),
                ));
                if let Some((wlo, whi)) = whisker {
                    let mid = y - band * 0.55;
                    whiskers.push(PathElement::new(
                        vec![(wlo.max(lo), mid), (whi.max(lo), mid)],
                        BLACK.stroke_width(2),
                    ));
                }
            }
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(name.clone())
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
            chart.draw_series(whiskers).map_err(err)?;
        }
        if let Some(x) = self.reference {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(x, -0.5), (x, n - 0.5)],
                    BLACK.mix(0.6).stroke_width(1),
                )))
                .map_err(err)?;
        }
        legend_and_present(&mut chart, SeriesLabelPosition::LowerRight)
    }
}

/// A row's time on a configuration over native's, for lower-is-better
/// figures: (median, smallest run, largest run), each over native's median.
fn ratio_to(f: &Figure, native: &Figure) -> Option<(f64, f64, f64)> {
    let ok = |v: f64| v.is_finite() && v > 0.0;
    if f.error.is_some() || native.error.is_some() || !ok(f.value) || !ok(native.value) {
        return None;
    }
    let (lo, hi) = f.range().unwrap_or((f.value, f.value));
    let x = |v: f64| {
        if f.lower_is_better {
            v / native.value
        } else {
            native.value / v
        }
    };
    let (a, b) = (x(lo), x(hi));
    Some((x(f.value), a.min(b), a.max(b)))
}

/// Horizontal bars, one group per row, one bar per configuration: the
/// median time over native's median (1 is native; log scale), with a
/// whisker from the smallest to the largest run. Returns whether there was
/// anything to draw (native must have run).
fn ratio_bars(suite: &SuiteResult, path: &PathBuf) -> Result<bool, String> {
    let Some(native) = ran(suite).find(|r| r.config == "native") else {
        return Ok(false);
    };
    let ops: Vec<String> = native
        .figures
        .iter()
        .filter(|f| f.error.is_none())
        .map(|f| f.op.clone())
        .collect();
    let configs: Vec<(String, BarValues)> = ran(suite)
        .map(|r| {
            let values = ops
                .iter()
                .map(|op| {
                    let f = r.figures.iter().find(|f| &f.op == op)?;
                    let (m, lo, hi) = ratio_to(f, native.figures.iter().find(|f| &f.op == op)?)?;
                    Some((m, Some((lo, hi))))
                })
                .collect();
            (r.config.clone(), values)
        })
        .collect();
    let values: Vec<f64> = configs
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .flat_map(|(m, w)| [*m, w.map_or(*m, |w| w.0), w.map_or(*m, |w| w.1)])
        .collect();
    if values.is_empty() {
        return Ok(false);
    }
    Bars {
        caption: format!(
            "{}: time over native's (median of {} runs, whisker: smallest to largest; log scale)",
            suite.suite, suite.repeats
        ),
        x_desc: "time over native's (1 = native)",
        ops,
        range: (
            values.iter().cloned().fold(1.0, f64::min) / 1.5,
            values.iter().cloned().fold(1.0, f64::max) * 1.5,
        ),
        configs,
        reference: Some(1.0),
    }
    .draw(path)?;
    Ok(true)
}

/// A configuration's curve: its name, the unit, and (threads, value) points.
struct Line {
    config: String,
    unit: String,
    points: Vec<(u32, f64)>,
}

/// The label of thread count `x` on the axis: the count where one was
/// measured, nothing between.
fn thread_label(measured: &[u32], x: u32) -> String {
    if measured.contains(&x) {
        x.to_string()
    } else {
        String::new()
    }
}

/// One line per configuration: the series' value against the thread count.
fn scaling(suite: &SuiteResult, series: &str, path: &PathBuf) -> Result<(), String> {
    let lines: Vec<Line> = ran(suite)
        .map(|r| {
            let mut pts: Vec<(u32, f64)> = r
                .figures
                .iter()
                .filter(|f| f.series.as_deref() == Some(series) && f.error.is_none())
                .filter_map(|f| Some((f.threads?, f.value)))
                .collect();
            pts.sort_by_key(|p| p.0);
            let unit = r
                .figures
                .iter()
                .find(|f| f.series.as_deref() == Some(series))
                .map(|f| f.unit.clone())
                .unwrap_or_default();
            Line {
                config: r.config.clone(),
                unit,
                points: pts,
            }
        })
        .filter(|l| !l.points.is_empty())
        .collect();
    // The axis is integral and labelled only at the measured thread counts:
    // a continuous axis rounded its ticks (0.5, 1.5, ...) to repeated labels.
    let mut measured: Vec<u32> = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)).collect();
    measured.sort_unstable();
    measured.dedup();
    let xmax = measured.last().copied().unwrap_or(1);
    let ymax = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        * 1.15;
    let ymax = if ymax > 0.0 { ymax } else { 1.0 };
    let unit = lines.first().map(|l| l.unit.clone()).unwrap_or_default();
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{}: {series} against threads", suite.suite), (FONT, 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(0u32..xmax + 1, 0.0..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("threads")
        .y_desc(unit)
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 17))
        .x_labels(xmax as usize + 2)
        .x_label_formatter(&|x| thread_label(&measured, *x))
        .draw()
        .map_err(err)?;
    for (
        c,
        Line {
            config, points: pts, ..
        },
    ) in lines.iter().enumerate()
    {
        let color = Palette99::pick(c).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(3)))
            .map_err(err)?
            .label(config.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3)));
        chart
            .draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))
            .map_err(err)?;
    }
    legend_and_present(&mut chart, SeriesLabelPosition::UpperLeft)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_to_native_carry_the_range_of_runs() {
        let time = |v: f64, runs: Vec<f64>| Figure {
            value: v,
            runs,
            lower_is_better: true,
            ..Figure::default()
        };
        let native = time(10.0, vec![9.0, 10.0, 12.0]);
        assert_eq!(
            ratio_to(&time(20.0, vec![15.0, 20.0, 40.0]), &native),
            Some((2.0, 1.5, 4.0))
        );
        let failed = Figure {
            error: Some("rsync: not found".into()),
            ..time(f64::NAN, vec![])
        };
        assert_eq!(ratio_to(&failed, &native), None);
        // A throughput: half native's rate is twice its time.
        let rate = Figure::rate("r", "MB/s", 50.0, 1);
        assert_eq!(
            ratio_to(&rate, &Figure::rate("r", "MB/s", 100.0, 1)),
            Some((2.0, 2.0, 2.0))
        );
    }

    #[test]
    fn thread_axis_labels_each_measured_count_once() {
        let measured = [1, 2, 4, 8];
        let labels: Vec<String> = (0..10)
            .map(|x| thread_label(&measured, x))
            .filter(|l| !l.is_empty())
            .collect();
        assert_eq!(labels, ["1", "2", "4", "8"]);
    }
}
