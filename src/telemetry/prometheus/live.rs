//! The incremental reads of the live cycle: the raw samples since the previous read.

use super::*;

impl PrometheusSource {
    /// The raw samples of `families` stamped in (`after`, `to`], chunk by chunk, and the
    /// number of queries sent.
    pub(super) async fn read_after(
        &self,
        after: i64,
        to: i64,
        families: &[&str],
        selector: &str,
        options: &ReadOptions,
    ) -> Result<(TraceBuilder, usize), PrometheusError> {
        let mut builder = TraceBuilder::new(&ReadOptions {
            skip_unknown_metrics: true,
            ..options.clone()
        });
        let queries = self
            .read_samples_after(after, to, 0, families, selector, &mut |s| builder.add(s))
            .await?;
        Ok((builder, queries))
    }

    /// The one range reader: hands every raw sample of `families` stamped in (`after`,
    /// `to`] to `on_sample`, family by family, each family chunk by chunk in time order
    /// (so each series' samples in increasing time), and returns the number of queries
    /// sent. An error from `on_sample` stops the read and is reported with the query.
    /// Each query covers `--prometheus-chunk`, the first `lead` seconds more (a read that
    /// starts a second early to include a sample exactly at its start is then one query
    /// per chunk, not one more for its last second).
    pub(super) async fn read_samples_after(
        &self,
        after: i64,
        to: i64,
        lead: i64,
        families: &[&str],
        selector: &str,
        on_sample: &mut dyn FnMut(&RawSample<'_>) -> Result<(), String>,
    ) -> Result<usize, PrometheusError> {
        let chunk = (self.config.chunk.as_secs() as i64).max(60);
        let mut queries = 0;
        for family in families {
            let mut end = after;
            let mut lead = lead.max(0);
            while end < to {
                let start = end;
                end = (start + lead + chunk).min(to);
                lead = 0;
                let query = format!("{family}{selector}[{}s]", end - start);
                // Streamed when the answer is what Prometheus writes; anything else is
                // read the generic way, whose errors are the ones reported.
                let answer = self
                    .instant_with(&query, end, |status, body| {
                        if status == 200
                            && let Some(series) = crate::telemetry::matrix::parse(body, family)
                        {
                            return Ok(Matrix::Streamed(series));
                        }
                        parse_answer(status, body).map(Matrix::Generic)
                    })
                    .await?;
                queries += 1;
                let fail = |message: String| PrometheusError {
                    url: self.config.url.clone(),
                    query: query.clone(),
                    message,
                };
                match answer {
                    Matrix::Streamed(series) => {
                        for s in &series {
                            for &(timestamp, value) in &s.samples {
                                on_sample(&RawSample {
                                    metric: family,
                                    series: &s.text,
                                    labels: &s.labels,
                                    value,
                                    timestamp,
                                    line: 0,
                                })
                                .map_err(fail)?;
                            }
                        }
                    }
                    Matrix::Generic(data) => {
                        for_each_matrix_sample(family, data, on_sample).map_err(fail)?
                    }
                }
            }
        }
        Ok(queries)
    }

    /// Brings `live` up to `now` for `policies` with one read of every GPU's samples
    /// since the previous one (or of the horizon, when it starts over): the same queries
    /// whatever the number of policies ([`super::live`]). On an error the state is left
    /// as it was, and the next refresh reads the whole gap.
    pub async fn refresh(
        &self,
        live: &mut crate::telemetry::live::LiveTelemetry,
        policies: &[crate::engine::Rules],
        settings: &crate::telemetry::live::ReadSettings,
        now: i64,
    ) -> Result<Refreshed, PrometheusError> {
        let to = now - settings.lag_seconds.max(0);
        let Some(read) = live.next_read(policies, to) else {
            return Ok(Refreshed::default());
        };
        let options = ReadOptions {
            workload_labels: settings.workload_labels.clone(),
            step_seconds: live.step_seconds(),
            skip_unknown_metrics: true,
        };
        let (builder, queries) = self
            .read_after(
                read.from,
                read.to,
                &crate::telemetry::live::FAMILIES,
                &settings.selector,
                &options,
            )
            .await?;
        // No sample at all is an answer too: every GPU followed has a gap.
        let trace = builder.finish(&self.config.url).ok();
        live.apply(read, policies, trace.as_ref());
        Ok(Refreshed {
            queries,
            rebuilt: read.rebuild,
            seconds_read: read.to - read.from,
            samples: trace.map_or(0, |t| t.samples),
        })
    }
}

/// A range-vector answer, streamed ([`crate::telemetry::matrix`]) or read the generic way.
enum Matrix {
    Streamed(Vec<crate::telemetry::matrix::Series>),
    Generic(Data),
}

/// What one [`PrometheusSource::refresh`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Refreshed {
    pub queries: usize,
    /// The state started over (start-up, a gap longer than the horizon, new rule sets).
    pub rebuilt: bool,
    pub seconds_read: i64,
    pub samples: u64,
}
