//! What each mode can do, in one table: every flag a mode may refuse is a
//! [`Feature`], and [`Plan::new`] is the one place that accepts or refuses a
//! mode with its features. A refusal is one line that says what to use
//! instead; nothing asked for is dropped silently.
use std::fmt;

use super::Mode;

/// The command a recording runs under: `record`, or a live view (`top`,
/// `serve`), which reads the maps over and over and keeps no windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum View {
    Record,
    Live,
}

/// What a recording may be asked for beyond counting (one per flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Feature {
    /// `--stacks`: stacks snapshotted at the lock probes and futex waits.
    Stacks,
    /// `--php`: routes and PHP frames, read at the lock probes.
    Php,
    /// `--handoffs`: acquisitions on another CPU than the one before.
    Handoffs,
    /// `--hold-times`: every lock and unlock call probed.
    HoldTimes,
    /// `--load`: locktrace drives the requests itself.
    Load,
    /// `--sample`: the fraction of time the windows cover.
    Sample,
    /// `--sample-period`: the windows' period.
    SamplePeriod,
    /// `--window-links`: how the windows are switched.
    WindowLinks,
    /// Kernel lock contention (`lock:contention_begin`/`end`): asked for
    /// unless `--no-kernel-locks`.
    KernelLocks,
}

impl Feature {
    #[cfg(test)]
    pub(crate) const ALL: [Feature; 9] = [
        Feature::Stacks,
        Feature::Php,
        Feature::Handoffs,
        Feature::HoldTimes,
        Feature::Load,
        Feature::Sample,
        Feature::SamplePeriod,
        Feature::WindowLinks,
        Feature::KernelLocks,
    ];
}

impl Mode {
    #[cfg(test)]
    pub(crate) const ALL: [Mode; 4] = [Mode::All, Mode::Contention, Mode::Sampled, Mode::Inproc];

    /// Whether acquisitions are counted (exactly, or scaled from windows).
    pub(crate) fn counts_acquisitions(self) -> bool {
        self != Mode::Contention
    }

    /// Whether every acquisition is counted exactly (sampled mode scales
    /// its windows': it would miss most lock init calls, for one).
    pub(crate) fn counts_every_acquisition(self) -> bool {
        matches!(self, Mode::All | Mode::Inproc)
    }

    /// Whether each route's lock calls are counted (`--php`): only at the
    /// lock probes. Inproc's stubs count each lock and caller, not the route
    /// of the request the thread serves; contention mode counts no call.
    pub(crate) fn counts_acquisitions_per_route(self) -> bool {
        self == Mode::All
    }

    /// Why `view` cannot run this mode at all; None where it can.
    pub(crate) fn view_refusal(self, view: View) -> Option<&'static str> {
        (view == View::Live && self == Mode::Sampled).then_some(
            "--mode sampled is for record; live views take --mode all, --mode inproc or --mode contention (contention costs least)",
        )
    }

    /// Why this mode cannot give `feature`, as the one line the user
    /// reads; None where it can.
    pub(crate) fn refusal(self, feature: Feature) -> Option<&'static str> {
        use Feature::*;
        match (self, feature) {
            (Mode::Sampled, Sample | SamplePeriod | WindowLinks) => None,
            (_, Sample) => Some(
                "--sample applies only with --mode sampled; add --mode sampled or drop --sample",
            ),
            (_, SamplePeriod) => Some(
                "--sample-period applies only with --mode sampled; add --mode sampled or drop --sample-period",
            ),
            (_, WindowLinks) => Some(
                "--window-links applies only with --mode sampled; add --mode sampled or drop --window-links",
            ),
            (Mode::Sampled, Load) => Some(
                "--mode sampled cannot drive --load; count requests with --request-probe or --requests, or use --mode all",
            ),
            (Mode::Sampled, Php) => Some(
                "--php counts each route's locks exactly, which sampled windows cannot: use it with --mode all (the default) or --mode contention",
            ),
            (Mode::Inproc, Handoffs) => Some(
                "--handoffs is counted at the lock probes: use it with --mode all (the default), not --mode inproc",
            ),
            (Mode::Contention, Handoffs) => Some(
                "--handoffs is counted at the lock probes, which --mode contention has none of: use it with --mode all (the default)",
            ),
            (Mode::All, HoldTimes) => None,
            (_, HoldTimes) => Some(
                "--hold-times needs every lock and unlock call probed: use it with --mode all (the default)",
            ),
            _ => None,
        }
    }
}

/// A refused mode and feature: its one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused(pub &'static str);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Refused {}

/// A mode with the features asked of it, every one of which it supports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub view: View,
    pub mode: Mode,
    features: Vec<Feature>,
}

impl Plan {
    /// The plan, or the first refusal among the features asked for (`asked`
    /// pairs each feature with whether its flag was given).
    pub(crate) fn new(view: View, mode: Mode, asked: &[(Feature, bool)]) -> Result<Plan, Refused> {
        let features: Vec<Feature> = asked
            .iter()
            .filter(|(_, on)| *on)
            .map(|(feature, _)| *feature)
            .collect();
        if let Some(line) = mode.view_refusal(view) {
            return Err(Refused(line));
        }
        if let Some(line) = features.iter().find_map(|feature| mode.refusal(*feature)) {
            return Err(Refused(line));
        }
        Ok(Plan {
            view,
            mode,
            features,
        })
    }

    pub(crate) fn has(&self, feature: Feature) -> bool {
        self.features.contains(&feature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every mode × feature pair under `record`, supported (None) or refused
    /// with the start of its line. A new mode or feature must be added here.
    #[test]
    fn every_mode_and_feature_is_supported_or_refused_in_one_line() {
        const SAMPLE: Option<&str> = Some("--sample applies only with --mode sampled");
        const PERIOD: Option<&str> = Some("--sample-period applies only with --mode sampled");
        const LINKS: Option<&str> = Some("--window-links applies only with --mode sampled");
        let table: [(Mode, [Option<&str>; 9]); 4] = [
            (
                Mode::All,
                [None, None, None, None, None, SAMPLE, PERIOD, LINKS, None],
            ),
            (
                Mode::Contention,
                [
                    None,
                    None,
                    Some("--handoffs is counted at the lock probes, which --mode contention"),
                    Some("--hold-times needs"),
                    None,
                    SAMPLE,
                    PERIOD,
                    LINKS,
                    None,
                ],
            ),
            (
                Mode::Sampled,
                [
                    None,
                    Some("--php counts each route's locks exactly"),
                    None,
                    Some("--hold-times needs"),
                    Some("--mode sampled cannot drive --load"),
                    None,
                    None,
                    None,
                    None,
                ],
            ),
            (
                Mode::Inproc,
                [
                    None,
                    None,
                    Some("--handoffs is counted at the lock probes: "),
                    Some("--hold-times needs"),
                    None,
                    SAMPLE,
                    PERIOD,
                    LINKS,
                    None,
                ],
            ),
        ];
        assert_eq!(table.len(), Mode::ALL.len());
        for (mode, expected) in table {
            for (feature, wanted) in Feature::ALL.into_iter().zip(expected) {
                let planned = Plan::new(View::Record, mode, &[(feature, true)]);
                match (wanted, planned) {
                    (None, Ok(plan)) => assert!(plan.has(feature)),
                    (Some(start), Err(Refused(line))) => {
                        assert!(line.starts_with(start), "{mode:?} {feature:?}: {line}");
                        assert!(!line.contains('\n'), "{line}");
                        assert!(line.contains("use ") || line.contains("add "), "{line}");
                    }
                    (wanted, got) => panic!("{mode:?} {feature:?}: wanted {wanted:?}, got {got:?}"),
                }
            }
        }
    }

    #[test]
    fn live_views_refuse_sampled_mode_whatever_is_asked() {
        let refused = Plan::new(View::Live, Mode::Sampled, &[]).unwrap_err();
        assert!(refused.0.starts_with("--mode sampled is for record"));
        for mode in [Mode::All, Mode::Contention, Mode::Inproc] {
            assert!(Plan::new(View::Live, mode, &[]).is_ok());
        }
    }

    #[test]
    fn flags_not_given_are_not_planned() {
        let plan = Plan::new(View::Record, Mode::Inproc, &[(Feature::Handoffs, false)]).unwrap();
        assert!(!plan.has(Feature::Handoffs));
    }

    #[test]
    fn the_capabilities_follow_the_modes() {
        let counting: Vec<Mode> = Mode::ALL
            .into_iter()
            .filter(|mode| mode.counts_acquisitions())
            .collect();
        assert_eq!(counting, [Mode::All, Mode::Sampled, Mode::Inproc]);
        let exact: Vec<Mode> = Mode::ALL
            .into_iter()
            .filter(|mode| mode.counts_every_acquisition())
            .collect();
        assert_eq!(exact, [Mode::All, Mode::Inproc]);
        let per_route: Vec<Mode> = Mode::ALL
            .into_iter()
            .filter(|mode| mode.counts_acquisitions_per_route())
            .collect();
        assert_eq!(per_route, [Mode::All]);
    }
}
