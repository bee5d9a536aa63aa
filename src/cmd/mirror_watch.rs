//! `strait mirror status --watch`: a live terminal dashboard (ratatui) of every mirror's
//! state, versions and lag, with a chart of the lag over the last minute.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::Result;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols;
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Axis, Block, Borders, Cell, Chart, Dataset, GraphType, Paragraph, Row, Table,
};
use ratatui::Frame;

use super::mirror_status::{gather, Report, StatusArgs};

/// Seconds of lag kept per mirror for the chart.
const CHART_SECONDS: usize = 120;
const REFRESH: Duration = Duration::from_secs(1);

struct View {
    report: Option<Report>,
    error: String,
    /// Per mirror: (seconds since the dashboard started, lag ms).
    series: Vec<(String, VecDeque<(f64, f64)>)>,
    started: Instant,
    addr: String,
}

impl View {
    fn update(&mut self, r: Result<Report>) {
        match r {
            Ok(rep) => {
                let t = self.started.elapsed().as_secs_f64();
                for m in &rep.mirrors {
                    let idx = match self.series.iter().position(|(n, _)| n == &m.mirror) {
                        Some(i) => i,
                        None => {
                            self.series.push((m.mirror.clone(), VecDeque::new()));
                            self.series.len() - 1
                        }
                    };
                    let s = &mut self.series[idx].1;
                    if s.len() >= CHART_SECONDS {
                        s.pop_front();
                    }
                    s.push_back((t, m.lag_ms as f64));
                }
                self.error.clear();
                self.report = Some(rep);
            }
            Err(e) => self.error = format!("{e:#}"),
        }
    }
}

fn state_color(s: &str) -> Color {
    match s {
        "following" => Color::Green,
        "stale" | "bootstrapping" | "needs-bootstrap" => Color::Yellow,
        "disconnected" | "halted" => Color::Red,
        _ => Color::Gray,
    }
}

fn draw(f: &mut Frame, v: &View) {
    let areas = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(3 + v.report.as_ref().map_or(1, |r| r.mirrors.len().max(1)) as u16),
        Constraint::Min(8),
    ])
    .split(f.area());
    let primary = v
        .report
        .as_ref()
        .map(|r| r.primary_version.to_string())
        .unwrap_or_else(|| "?".into());
    let head = Paragraph::new(Line::from(vec![
        Span::styled(
            "strait mirror status ",
            Style::default().add_modifier(Modifier::BOLD),
        ),
        Span::raw(format!("— {}  primary version {primary}  ", v.addr)),
        if v.error.is_empty() {
            Span::raw("(q quits)")
        } else {
            Span::styled(v.error.clone(), Style::default().fg(Color::Red))
        },
    ]))
    .block(Block::default().borders(Borders::ALL));
    f.render_widget(head, areas[0]);

    let header = Row::new(
        [
            "mirror", "state", "applied", "latest", "lag", "lag ms", "p50 ms", "p99 ms", "max ms",
            "rec/s", "source",
        ]
        .map(|h| Cell::from(h).style(Style::default().add_modifier(Modifier::BOLD))),
    );
    let rows: Vec<Row> = v
        .report
        .as_ref()
        .map(|r| {
            r.mirrors
                .iter()
                .map(|m| {
                    Row::new(vec![
                        Cell::from(m.mirror.clone()),
                        Cell::from(m.state.clone())
                            .style(Style::default().fg(state_color(&m.state))),
                        Cell::from(m.applied_version.to_string()),
                        Cell::from(m.latest_version.to_string()),
                        Cell::from(m.lag_versions.to_string()),
                        Cell::from(m.lag_ms.to_string()),
                        Cell::from(m.lag_p50_ms.to_string()),
                        Cell::from(m.lag_p99_ms.to_string()),
                        Cell::from(m.lag_max_ms.to_string()),
                        Cell::from(format!("{:.0}", m.apply_rate)),
                        Cell::from(if m.error.is_empty() {
                            m.source.clone()
                        } else {
                            m.error.clone()
                        }),
                    ])
                })
                .collect()
        })
        .unwrap_or_default();
    let table = Table::new(
        rows,
        [
            Constraint::Length(10),
            Constraint::Length(14),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(7),
            Constraint::Length(8),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(8),
            Constraint::Min(10),
        ],
    )
    .header(header)
    .block(Block::default().borders(Borders::ALL).title(" mirrors "));
    f.render_widget(table, areas[1]);

    let now = v.started.elapsed().as_secs_f64();
    let x0 = (now - CHART_SECONDS as f64).max(0.0);
    let colors = [
        Color::Cyan,
        Color::Magenta,
        Color::Yellow,
        Color::Green,
        Color::Blue,
    ];
    let points: Vec<Vec<(f64, f64)>> = v
        .series
        .iter()
        .map(|(_, s)| s.iter().copied().collect())
        .collect();
    let ymax = points.iter().flatten().map(|p| p.1).fold(10.0f64, f64::max) * 1.2;
    let datasets = v
        .series
        .iter()
        .zip(&points)
        .enumerate()
        .map(|(i, ((name, _), pts))| {
            Dataset::default()
                .name(name.clone())
                .marker(symbols::Marker::Braille)
                .graph_type(GraphType::Line)
                .style(Style::default().fg(colors[i % colors.len()]))
                .data(pts)
        })
        .collect();
    let chart = Chart::new(datasets)
        .block(
            Block::default()
                .borders(Borders::ALL)
                .title(" lag (ms) over the last two minutes "),
        )
        .x_axis(
            Axis::default()
                .bounds([x0, now.max(1.0)])
                .labels([format!("-{}s", CHART_SECONDS), "now".to_string()]),
        )
        .y_axis(Axis::default().bounds([0.0, ymax]).labels([
            "0".to_string(),
            format!("{:.0}", ymax / 2.0),
            format!("{ymax:.0}"),
        ]));
    f.render_widget(chart, areas[2]);
}

pub async fn run(a: &StatusArgs) -> Result<()> {
    let mut terminal = ratatui::init();
    let mut view = View {
        report: None,
        error: String::new(),
        series: vec![],
        started: Instant::now(),
        addr: a.addr.clone(),
    };
    let result = async {
        loop {
            view.update(gather(a).await);
            terminal.draw(|f| draw(f, &view))?;
            let until = Instant::now() + REFRESH;
            while Instant::now() < until {
                let wait = until.saturating_duration_since(Instant::now());
                let ev = tokio::task::spawn_blocking(move || -> std::io::Result<Option<Event>> {
                    if event::poll(wait.min(Duration::from_millis(200)))? {
                        Ok(Some(event::read()?))
                    } else {
                        Ok(None)
                    }
                })
                .await??;
                if let Some(Event::Key(k)) = ev {
                    let quit = matches!(k.code, KeyCode::Char('q') | KeyCode::Esc)
                        || (k.code == KeyCode::Char('c')
                            && k.modifiers.contains(KeyModifiers::CONTROL));
                    if quit {
                        return Ok::<(), anyhow::Error>(());
                    }
                }
            }
        }
    }
    .await;
    ratatui::restore();
    result
}
