//! The page for people: `GET /ui` and the memory picture it shows.
//!
//! Design: one HTML file (`ui/page.html`, HTML, CSS and a little JavaScript, no framework, no
//! network at build or run time) embedded with `include_str!`, so the binary grows by its size
//! (about 20 KB). The page only uses `fetch`: it polls `GET /ui/memory` (this module: the
//! plan's numbers, what the server holds now, and the memory picture as SVG markup) and
//! `GET /metrics` (the load: the same counters and histograms Prometheus scrapes), once a
//! second each, and streams chat answers from `/v1/chat/completions` as server-sent events
//! read from the response body. Pressure events (the governor's reactions, prefix-cache sheds)
//! are counter steps between two polls; the page marks them on its timeline.
//!
//! The memory picture has one owner, [`memory_svg`]: the page shows it with the live numbers,
//! and `snug plan MODEL --svg FILE` / `--html FILE` writes it from a plan alone
//! ([`plan_html`]). It is one bar for the budget whose segments are sized by the plan's own
//! numbers: weights resident, the KV cache split by its blocks (used by sequences, held by the
//! prefix cache alone, free), the adapters' share split into what hot adapters hold and what
//! is free, scratch (activations and logits), the process (tokenizer heap, fixed overhead), the
//! plan's headroom and what the plan leaves unused. Marks on the bar show the measured resident
//! set and the cgroup limit; a thin row under it shows the mapped file against the weights
//! resident.
//!
//! Access: `/ui` is the page only (no data), so it needs no API key: a browser cannot send one
//! when it opens a URL. Every call the page makes goes to keyed routes; with `--api-key` the
//! page asks for the key, keeps it in the tab's `sessionStorage` and sends it as
//! `Authorization: Bearer`. `Host` and `Origin` rules apply to `/ui` as to every route.
//!
//! Cost: `/ui` copies a static string; `/ui/memory` reads the cgroup files and
//! `/proc/self/status` once, takes the adapter store's stats and writes about 3 KB of SVG.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use memory::fmt_bytes;
use schemars::JsonSchema;
use serde::Serialize;

use crate::AppState;

/// The page, embedded.
pub const PAGE: &str = include_str!("ui/page.html");

/// The plan's memory numbers, in bytes: what a server was planned with, or what
/// `snug plan` predicts.
#[derive(Clone, Debug, Default, Serialize, JsonSchema)]
pub struct PlanPicture {
    /// The budget the plan was made in.
    pub budget: u64,
    /// Kept free below the budget (`runtime::plan::headroom`).
    pub headroom: u64,
    /// Weights resident at the peak.
    pub weights: u64,
    /// The model file, all of it mapped.
    pub mapped: u64,
    /// The KV cache of every sequence.
    pub kv: u64,
    /// The LoRA adapters' share.
    pub adapters: u64,
    /// Activations, sessions and logits.
    pub scratch: u64,
    /// Tokenizer heap and the process's fixed overhead.
    pub process: u64,
    /// The predicted peak: the sum of the terms above but the budget, headroom and mapping.
    pub total: u64,
    /// The configuration in words (`runtime::plan::describe`).
    pub config: String,
}

/// What a running server holds now.
#[derive(Clone, Debug, Default, Serialize, JsonSchema)]
pub struct Live {
    /// KV blocks held by sequences, by the prefix cache alone, and free.
    pub kv_blocks_used: u64,
    pub kv_blocks_cached: u64,
    pub kv_blocks_free: u64,
    /// Bytes hot adapters hold in the page pool.
    pub adapter_hot_bytes: u64,
    /// Registered adapters by tier.
    pub adapters_hot: usize,
    pub adapters_warm: usize,
    pub adapters_cold: usize,
    /// The process's resident set.
    pub rss: Option<u64>,
    /// The tightest cgroup memory limit, and that cgroup's usage.
    pub limit: Option<u64>,
    pub usage: Option<u64>,
}

/// One segment of the budget bar.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Segment {
    /// A stable name (`weights`, `kv_used`, …): the SVG's `data-key`.
    pub key: &'static str,
    pub label: String,
    pub bytes: u64,
}

const fn color(key: &str) -> &'static str {
    match key.as_bytes() {
        b"weights" => "#3b6fb6",
        b"kv_used" => "#d9822b",
        b"kv_cached" => "#f0b35e",
        b"kv_free" => "#f7dcb4",
        b"adapters_hot" => "#8e5bb5",
        b"adapters_free" => "#d7c3e8",
        b"scratch" => "#3f9c6d",
        b"process" => "#8a8f98",
        b"headroom" => "#e4e6ea",
        _ => "#ffffff",
    }
}

/// `part` of `whole` taken from `bytes` (exact in u128; 0 of an empty whole).
fn share(bytes: u64, part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    (bytes as u128 * part.min(whole) as u128 / whole as u128) as u64
}

/// The bar's segments, left to right, sized by `plan`'s numbers; `live` splits the KV cache by
/// its blocks and the adapters' share by what hot adapters hold (without it, all of the KV
/// cache and the share are free). The planned segments sum to `plan.total`; headroom and
/// unused fill the rest of the budget.
pub fn segments(plan: &PlanPicture, live: Option<&Live>) -> Vec<Segment> {
    let (used, cached, free) =
        live.map_or((0, 0, 1), |l| (l.kv_blocks_used, l.kv_blocks_cached, l.kv_blocks_free));
    let blocks = used + cached + free;
    let kv_used = share(plan.kv, used, blocks);
    let kv_cached = share(plan.kv, cached, blocks);
    let hot = live.map_or(0, |l| l.adapter_hot_bytes.min(plan.adapters));
    let tiers = live.map_or(String::new(), |l| {
        format!(" ({} hot, {} warm, {} cold)", l.adapters_hot, l.adapters_warm, l.adapters_cold)
    });
    let room = plan.budget.saturating_sub(plan.total);
    let headroom = plan.headroom.min(room);
    let seg = |key, label: String, bytes| Segment { key, label, bytes };
    vec![
        seg("weights", "weights resident".into(), plan.weights),
        seg("kv_used", format!("KV used ({used} blocks)"), kv_used),
        seg("kv_cached", format!("KV prefix cache ({cached} blocks)"), kv_cached),
        seg(
            "kv_free",
            if live.is_some() { format!("KV free ({free} blocks)") } else { "KV cache".into() },
            plan.kv - kv_used - kv_cached,
        ),
        seg("adapters_hot", format!("adapters hot{tiers}"), hot),
        seg("adapters_free", "adapter room free".into(), plan.adapters - hot),
        seg("scratch", "scratch (activations, logits)".into(), plan.scratch),
        seg("process", "process (tokenizer, overhead)".into(), plan.process),
        seg("headroom", "headroom".into(), headroom),
        seg("unused", "unused budget".into(), room - headroom),
    ]
}

/// Text escaped for XML and HTML content and attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const WIDTH: f64 = 960.0;
const BAR_Y: f64 = 34.0;
const BAR_H: f64 = 44.0;

/// The memory picture as a standalone SVG document: [`segments`] as one bar (each `rect` has
/// `class="seg"`, `data-key` and `data-bytes`), marks for the measured resident set and the
/// cgroup limit when `live` has them, the mapped file under it, and a legend.
pub fn memory_svg(plan: &PlanPicture, live: Option<&Live>) -> String {
    let segs = segments(plan, live);
    let rss = live.and_then(|l| l.rss);
    let limit = live.and_then(|l| l.limit);
    // Everything drawn fits: the budget, an over-budget plan, a resident set above both. A
    // limit far above them (none set: the host's memory) is written, not drawn.
    let scale = plan.budget.max(plan.total).max(rss.unwrap_or(0)).max(1) as f64;
    let x = |b: u64| (b as f64 / scale * WIDTH).min(WIDTH);
    // A plan alone has nothing in use: its legend leaves out what only a server fills.
    let legend: Vec<&Segment> = segs
        .iter()
        .filter(|g| live.is_some() || !matches!(g.key, "kv_used" | "kv_cached" | "adapters_hot"))
        .collect();
    let legend_rows = legend.len().div_ceil(3);
    let height = 150.0 + 18.0 * legend_rows as f64;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="memory" viewBox="0 0 {w} {height}" width="{w}" height="{height}" font-family="system-ui, sans-serif" font-size="13" data-budget="{b}" data-total="{t}">"#,
        w = WIDTH + 20.0,
        b = plan.budget,
        t = plan.total,
    );
    let _ = write!(
        s,
        r#"<text x="10" y="20" font-weight="600">budget {} · plan {} · {}</text>"#,
        fmt_bytes(plan.budget),
        fmt_bytes(plan.total),
        esc(&plan.config)
    );
    let _ = write!(
        s,
        r##"<rect x="10" y="{BAR_Y}" width="{WIDTH}" height="{BAR_H}" fill="#ffffff" stroke="#555"/>"##
    );
    let mut at = 0u64;
    for g in &segs {
        let (x0, x1) = (x(at), x(at.saturating_add(g.bytes)));
        at = at.saturating_add(g.bytes);
        let _ = write!(
            s,
            r#"<rect class="seg" data-key="{k}" data-bytes="{b}" x="{x:.1}" y="{BAR_Y}" width="{w:.1}" height="{BAR_H}" fill="{c}"><title>{l}: {f}</title></rect>"#,
            k = g.key,
            b = g.bytes,
            x = 10.0 + x0,
            w = x1 - x0,
            c = color(g.key),
            l = esc(&g.label),
            f = fmt_bytes(g.bytes),
        );
    }
    if plan.total > plan.budget {
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{}" fill="#b3261e" text-anchor="end">over budget by {}</text>"##,
            10.0 + WIDTH,
            BAR_Y - 4.0,
            fmt_bytes(plan.total - plan.budget)
        );
    }
    let mut mark = |class: &str, bytes: u64, color: &str, text: String, dy: f64| {
        let mx = 10.0 + x(bytes);
        let anchor = if mx > WIDTH * 0.8 { "end" } else { "start" };
        let _ = write!(
            s,
            r#"<g class="{class}" data-bytes="{bytes}"><line x1="{mx:.1}" x2="{mx:.1}" y1="{y1}" y2="{y2}" stroke="{color}" stroke-width="3"/><text x="{mx:.1}" y="{ty}" fill="{color}" text-anchor="{anchor}">{text}</text></g>"#,
            y1 = BAR_Y - 6.0,
            y2 = BAR_Y + BAR_H + 6.0,
            ty = BAR_Y + BAR_H + 20.0 + dy,
        );
    };
    if let Some(r) = rss {
        mark("rss", r, "#111", format!("RSS {}", fmt_bytes(r)), 0.0);
    }
    if let Some(l) = limit {
        if (l as f64) <= scale {
            mark("limit", l, "#b3261e", format!("cgroup limit {}", fmt_bytes(l)), 16.0);
        }
    }
    // The mapped file against the weights resident, on the same scale.
    let my = BAR_Y + BAR_H + 44.0;
    let _ = write!(
        s,
        r##"<g class="mapped" data-bytes="{m}"><rect x="10" y="{my}" width="{mw:.1}" height="10" fill="none" stroke="#3b6fb6" stroke-dasharray="4 2"/><rect x="10" y="{my}" width="{rw:.1}" height="10" fill="#3b6fb6"/><text x="10" y="{ty}">file mapped {mf}{more}, {rf} of it resident</text></g>"##,
        m = plan.mapped,
        mw = x(plan.mapped),
        rw = x(plan.weights.min(plan.mapped)),
        ty = my + 24.0,
        mf = fmt_bytes(plan.mapped),
        more = if plan.mapped as f64 > scale { " (past the bar's end)" } else { "" },
        rf = fmt_bytes(plan.weights.min(plan.mapped)),
    );
    for (i, g) in legend.iter().enumerate() {
        let lx = 10.0 + (i % 3) as f64 * 320.0;
        let ly = my + 44.0 + (i / 3) as f64 * 18.0;
        let _ = write!(
            s,
            r##"<rect x="{lx}" y="{sy}" width="12" height="12" fill="{c}" stroke="#555"/><text x="{tx}" y="{ly}">{l} {f}</text>"##,
            sy = ly - 10.0,
            c = color(g.key),
            tx = lx + 18.0,
            l = esc(&g.label),
            f = fmt_bytes(g.bytes),
        );
    }
    if let Some(l) = limit.filter(|&l| l as f64 > scale) {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="end">cgroup limit {} (past the bar's end)</text>"#,
            10.0 + WIDTH,
            my + 24.0,
            fmt_bytes(l)
        );
    }
    s.push_str("</svg>");
    s
}

/// A standalone HTML page with the plan's memory picture (`snug plan --html`).
pub fn plan_html(title: &str, plan: &PlanPicture) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>snug plan: {t}</title>\
         <style>body{{font-family:system-ui,sans-serif;margin:2em;color:#222}}h1{{font-size:1.2em}}svg{{max-width:100%;height:auto}}</style>\
         </head><body><h1>snug plan: {t}</h1>\n{svg}\n</body></html>\n",
        t = esc(title),
        svg = memory_svg(plan, None)
    )
}

/// `GET /ui`: the page (no data in it; see the module's notes on access).
pub async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
                 frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
        .into_response()
}

/// What the server holds now, read from its counters, the adapter store and `/proc`.
fn live(st: &crate::AppState) -> Live {
    let c = &st.engine.counters;
    let g = |v: i64| u64::try_from(v).unwrap_or(0);
    let stats = st.adapters.store.stats();
    let cgroup = memory::probe::cgroup_limit();
    let usage = cgroup.as_ref().and_then(|(_, src)| match src {
        memory::probe::BudgetSource::CgroupV1(f) | memory::probe::BudgetSource::CgroupV2(f) => {
            memory::probe::cgroup_usage(f)
        }
        _ => None,
    });
    Live {
        kv_blocks_used: g(c.kv_blocks_used.get()),
        kv_blocks_cached: g(c.kv_blocks_cached.get()),
        kv_blocks_free: g(c.kv_blocks_free.get()),
        adapter_hot_bytes: (stats.pool.adapter as u64).saturating_mul(stats.pool.page_bytes as u64),
        adapters_hot: stats.hot,
        adapters_warm: stats.warm,
        adapters_cold: stats.cold,
        rss: memory::probe::self_rss(),
        limit: cgroup.map(|(l, _)| l),
        usage,
    }
}

/// `GET /ui/memory`'s answer.
#[derive(Debug, Serialize, JsonSchema)]
#[schemars(rename = "UiMemory")]
pub struct Memory {
    pub model: String,
    pub plan: PlanPicture,
    pub live: Live,
    pub segments: Vec<Segment>,
    /// The bar as SVG.
    pub svg: String,
    pub pressure_events: u64,
    pub prefix_sheds: u64,
    pub n_seq: usize,
    pub n_ctx: usize,
    pub uptime_seconds: u64,
}

/// `GET /ui/memory`: the plan, what the server holds now, the bar's segments and the picture.
pub async fn memory(State(st): State<std::sync::Arc<AppState>>) -> Response {
    let live = live(&st);
    axum::Json(Memory {
        model: st.card.name.clone(),
        plan: st.plan.clone(),
        segments: segments(&st.plan, Some(&live)),
        svg: memory_svg(&st.plan, Some(&live)),
        live,
        pressure_events: st.metrics.pressure_events.get(),
        prefix_sheds: st.engine.counters.prefix_sheds.get(),
        n_seq: st.engine.n_seq,
        n_ctx: st.engine.n_ctx,
        uptime_seconds: st.started.elapsed().as_secs(),
    })
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> PlanPicture {
        PlanPicture {
            budget: 6 << 30,
            headroom: 192 << 20,
            weights: 400 << 20,
            mapped: 500 << 20,
            kv: 96 << 20,
            adapters: 32 << 20,
            scratch: 50 << 20,
            process: 20 << 20,
            total: (400 + 96 + 32 + 50 + 20) << 20,
            config: "ctx 4096 <f16>".into(),
        }
    }

    #[test]
    fn segments_are_the_plans_numbers_and_fill_the_budget() {
        let p = plan();
        let live = Live {
            kv_blocks_used: 3,
            kv_blocks_cached: 1,
            kv_blocks_free: 8,
            adapter_hot_bytes: 8 << 20,
            ..Live::default()
        };
        let s = segments(&p, Some(&live));
        let by = |k: &str| s.iter().find(|g| g.key == k).unwrap().bytes;
        assert_eq!(by("weights"), p.weights);
        assert_eq!(by("kv_used"), 24 << 20);
        assert_eq!(by("kv_cached"), 8 << 20);
        assert_eq!(by("kv_free"), 64 << 20);
        assert_eq!(by("adapters_hot") + by("adapters_free"), p.adapters);
        assert_eq!(by("adapters_hot"), 8 << 20);
        assert_eq!(by("headroom"), p.headroom);
        let planned: u64 =
            s.iter().filter(|g| !matches!(g.key, "headroom" | "unused")).map(|g| g.bytes).sum();
        assert_eq!(planned, p.total);
        assert_eq!(s.iter().map(|g| g.bytes).sum::<u64>(), p.budget);
        // Without a server: the whole cache and share are free.
        let s = segments(&p, None);
        assert_eq!(s.iter().find(|g| g.key == "kv_free").unwrap().bytes, p.kv);
        assert_eq!(s.iter().find(|g| g.key == "adapters_free").unwrap().bytes, p.adapters);
    }

    #[test]
    fn an_over_budget_plan_has_no_headroom_and_says_so() {
        let p = PlanPicture { budget: 300 << 20, ..plan() };
        let s = segments(&p, None);
        assert!(s.iter().filter(|g| matches!(g.key, "headroom" | "unused")).all(|g| g.bytes == 0));
        let svg = memory_svg(&p, None);
        assert!(svg.contains("over budget by 298.0 MiB"), "{svg}");
    }

    #[test]
    fn the_svg_draws_each_segment_to_scale_and_escapes_text() {
        let p = plan();
        let live = Live { rss: Some(1 << 30), limit: Some(2 << 30), ..Live::default() };
        let svg = memory_svg(&p, Some(&live));
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("&lt;f16&gt;") && !svg.contains("<f16>"));
        let weights = svg.split(r#"data-key="weights""#).nth(1).unwrap();
        let width: f64 =
            weights.split("width=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
        // 400 MiB of 6 GiB over 960 units.
        assert!((width - 400.0 / 6144.0 * WIDTH).abs() < 0.1, "{width}");
        assert_eq!(svg.matches(r#"class="seg""#).count(), segments(&p, None).len());
        assert!(svg.contains(r#"class="rss" data-bytes="1073741824""#));
        assert!(svg.contains(r#"class="limit" data-bytes="2147483648""#));
        // A limit past the budget is written, not drawn.
        let far = Live { limit: Some(64 << 30), ..Live::default() };
        let svg = memory_svg(&p, Some(&far));
        assert!(!svg.contains(r#"class="limit""#) && svg.contains("cgroup limit 64.00 GiB"));
    }

    #[test]
    fn the_page_is_small_and_self_contained() {
        assert!(PAGE.len() < 200 << 10, "{} bytes", PAGE.len());
        for outside in ["http://", "https://", "//cdn", "import("] {
            assert!(!PAGE.contains(outside), "the page reaches out: {outside}");
        }
        // fetch and server-sent events (read from fetch's body) only.
        for other in ["WebSocket", "XMLHttpRequest", "EventSource"] {
            assert!(!PAGE.contains(other), "the page uses {other}");
        }
        assert!(PAGE.contains("sessionStorage") && PAGE.contains("/ui/memory"));
    }
}
