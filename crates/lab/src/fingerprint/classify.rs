//! The attacker of `lab fingerprint`: features an on-path observer computes
//! from the sizes and times of a session's (encrypted) packets, and three
//! classifiers of the video's resolution, scored by stratified k-fold
//! cross-validation with a fixed seed.
//!
//! - **Bitrate thresholds** (A. Sengupta, "Streaming over QUIC: Applications
//!   in Media and IoT", 2025, its controlled MoQT testbed: 93 %): the mean
//!   bitrate of a session; bounds between the resolutions learnt from the
//!   training folds (midway, in log scale, between neighbouring classes'
//!   medians), as the study set its bounds from training videos.
//! - **Burst-size thresholds** (the study's YouTube method: 77 %): the
//!   median bytes of a burst (packets closer than [`BURST_GAP_US`]), bounds
//!   learnt the same way.
//! - **k-NN** on windowed size/timing features ([`FEATURES`]), z-scored with
//!   the training fold's mean and deviation, k = [`K`], Euclidean distance.
//!
//! The k-NN is written here rather than taken from a crate: it is a few
//! dozen lines, deterministic (ties broken by distance, then by class
//! order), needs no numeric stack, and the lab's runs stay reproducible
//! bit for bit; no well-kept Rust crate would add anything for ~100 samples
//! of 20 features.

use serde::Serialize;

/// Packets further apart than this start a new burst, µs. A frame of live
/// video leaves as one burst every 33 ms at 30 fps.
pub const BURST_GAP_US: u64 = 15_000;
/// Neighbours of the k-NN.
pub const K: usize = 5;

/// Names of the k-NN's features, in vector order.
pub const FEATURES: [&str; 20] = [
    "log kbit/s",
    "log bytes/100 ms mean",
    "log bytes/100 ms sd",
    "log bytes/100 ms p10",
    "log bytes/100 ms p50",
    "log bytes/100 ms p90",
    "log bytes/100 ms max",
    "log bytes/1 s min",
    "log bytes/1 s max",
    "log bytes/1 s sd",
    "packet size mean",
    "share of packets > 1000 B",
    "share of packets < 200 B",
    "log packets/s",
    "log gap p50 µs",
    "log gap p90 µs",
    "log bursts/s",
    "log burst bytes p50",
    "log burst bytes p90",
    "log burst bytes max",
];

/// What the observer computes from one session's packets.
#[derive(Debug, Clone, Serialize)]
pub struct SessionFeatures {
    /// Mean bitrate over the observed window, kbit/s (IP bytes).
    pub kbps: f64,
    /// Median burst size, bytes.
    pub burst_p50: f64,
    /// Packets seen.
    pub packets: usize,
    /// The k-NN's vector ([`FEATURES`]).
    pub vector: Vec<f64>,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64;
    (m, var.sqrt())
}

fn ln1p(x: f64) -> f64 {
    x.max(0.0).ln_1p()
}

/// Bytes per window of `win_us` over `[0, span_us)`.
fn windows(pkts: &[(u64, u32)], span_us: u64, win_us: u64) -> Vec<f64> {
    let n = span_us.div_ceil(win_us).max(1) as usize;
    let mut w = vec![0.0; n];
    for &(t, len) in pkts {
        if t < span_us {
            w[(t / win_us) as usize] += f64::from(len);
        }
    }
    w
}

/// Sizes of the bursts of `pkts` (sorted by time).
pub fn bursts(pkts: &[(u64, u32)]) -> Vec<f64> {
    let mut out = Vec::new();
    let mut cur = 0.0;
    let mut last: Option<u64> = None;
    for &(t, len) in pkts {
        if last.is_some_and(|l| t.saturating_sub(l) > BURST_GAP_US) {
            out.push(cur);
            cur = 0.0;
        }
        cur += f64::from(len);
        last = Some(t);
    }
    if last.is_some() {
        out.push(cur);
    }
    out
}

/// Features of one session: `pkts` are (µs since the window's start, IP
/// bytes) of its data direction, sorted by time; `span_us` the window.
pub fn features(pkts: &[(u64, u32)], span_us: u64) -> SessionFeatures {
    let span_s = span_us as f64 / 1e6;
    let bytes: f64 = pkts.iter().map(|p| f64::from(p.1)).sum();
    let kbps = bytes * 8.0 / 1000.0 / span_s.max(1e-9);
    let w100 = windows(pkts, span_us, 100_000);
    let (m100, sd100) = mean_sd(&w100);
    let s100 = sorted(w100);
    let w1s = windows(pkts, span_us, 1_000_000);
    let (_, sd1s) = mean_sd(&w1s);
    let s1s = sorted(w1s);
    let sizes: Vec<f64> = pkts.iter().map(|p| f64::from(p.1)).collect();
    let n = sizes.len().max(1) as f64;
    let (size_mean, _) = mean_sd(&sizes);
    let big = sizes.iter().filter(|&&s| s > 1000.0).count() as f64 / n;
    let small = sizes.iter().filter(|&&s| s < 200.0).count() as f64 / n;
    let gaps = sorted(
        pkts.windows(2)
            .map(|w| w[1].0.saturating_sub(w[0].0) as f64)
            .collect(),
    );
    let b = sorted(bursts(pkts));
    let burst_p50 = quantile(&b, 0.5);
    let vector = vec![
        ln1p(kbps),
        ln1p(m100),
        ln1p(sd100),
        ln1p(quantile(&s100, 0.1)),
        ln1p(quantile(&s100, 0.5)),
        ln1p(quantile(&s100, 0.9)),
        ln1p(s100.last().copied().unwrap_or(0.0)),
        ln1p(s1s.first().copied().unwrap_or(0.0)),
        ln1p(s1s.last().copied().unwrap_or(0.0)),
        ln1p(sd1s),
        size_mean,
        big,
        small,
        ln1p(sizes.len() as f64 / span_s.max(1e-9)),
        ln1p(quantile(&gaps, 0.5)),
        ln1p(quantile(&gaps, 0.9)),
        ln1p(b.len() as f64 / span_s.max(1e-9)),
        ln1p(burst_p50),
        ln1p(quantile(&b, 0.9)),
        ln1p(b.last().copied().unwrap_or(0.0)),
    ];
    SessionFeatures {
        kbps,
        burst_p50,
        packets: pkts.len(),
        vector,
    }
}

/// A classifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Classifier {
    /// Thresholds on the mean bitrate.
    Bitrate,
    /// Thresholds on the median burst size.
    Burst,
    /// k-NN on the feature vector.
    Knn,
}

impl Classifier {
    /// All, in table order.
    pub const ALL: [Classifier; 3] = [Classifier::Bitrate, Classifier::Burst, Classifier::Knn];

    /// Label.
    pub fn label(self) -> &'static str {
        match self {
            Classifier::Bitrate => "bitrate thresholds",
            Classifier::Burst => "burst-size thresholds",
            Classifier::Knn => "k-NN (k=5, 20 windowed features)",
        }
    }

    /// Short label (JSON keys, plot legends).
    pub fn key(self) -> &'static str {
        match self {
            Classifier::Bitrate => "bitrate",
            Classifier::Burst => "burst",
            Classifier::Knn => "knn",
        }
    }
}

/// Scores of one classifier.
#[derive(Debug, Clone, Serialize)]
pub struct Score {
    /// Classifier key.
    pub classifier: &'static str,
    /// Correct predictions over all folds / samples.
    pub accuracy: f64,
    /// Accuracy of each fold.
    pub fold_accuracy: Vec<f64>,
    /// `confusion[true][predicted]` counts.
    pub confusion: Vec<Vec<usize>>,
    /// Samples (the confusion matrix sums to this).
    pub samples: usize,
}

/// A small deterministic generator (SplitMix64), for the folds.
pub struct SplitMix(pub u64);

impl SplitMix {
    /// Next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
}

/// Stratified folds: each class's samples shuffled (seeded) and dealt round
/// robin; returns the fold of each sample. `k` is lowered to the smallest
/// class's size (at least 2).
pub fn stratified_folds(
    labels: &[usize],
    classes: usize,
    k: usize,
    seed: u64,
) -> (Vec<usize>, usize) {
    let smallest = (0..classes)
        .map(|c| labels.iter().filter(|&&l| l == c).count())
        .filter(|&n| n > 0)
        .min()
        .unwrap_or(0);
    let k = k.min(smallest).max(2);
    let mut rng = SplitMix(seed);
    let mut fold = vec![0; labels.len()];
    for c in 0..classes {
        let mut idx: Vec<usize> = (0..labels.len()).filter(|&i| labels[i] == c).collect();
        for i in (1..idx.len()).rev() {
            let j = rng.below(i + 1);
            idx.swap(i, j);
        }
        for (n, &i) in idx.iter().enumerate() {
            fold[i] = n % k;
        }
    }
    (fold, k)
}

/// Thresholds on one value (log scale): class medians sorted, bounds
/// midway between neighbours; predicts the class whose interval holds `x`.
#[derive(Debug, Clone)]
pub struct Thresholds {
    /// (log median, class), sorted by median.
    centres: Vec<(f64, usize)>,
}

impl Thresholds {
    /// Learns from (value, class) pairs.
    pub fn fit(samples: &[(f64, usize)], classes: usize) -> Self {
        let mut centres = Vec::new();
        for c in 0..classes {
            let v = sorted(
                samples
                    .iter()
                    .filter(|s| s.1 == c)
                    .map(|s| s.0.max(1e-9).ln())
                    .collect(),
            );
            if !v.is_empty() {
                centres.push((quantile(&v, 0.5), c));
            }
        }
        centres.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        Self { centres }
    }

    /// The learnt bounds between neighbouring classes (in the value's unit).
    pub fn bounds(&self) -> Vec<f64> {
        self.centres
            .windows(2)
            .map(|w| ((w[0].0 + w[1].0) / 2.0).exp())
            .collect()
    }

    /// Predicted class.
    pub fn predict(&self, x: f64) -> usize {
        let lx = x.max(1e-9).ln();
        let mut out = self.centres.first().map_or(0, |c| c.1);
        for w in self.centres.windows(2) {
            if lx > (w[0].0 + w[1].0) / 2.0 {
                out = w[1].1;
            }
        }
        out
    }
}

/// k-NN: z-scored by the training set, Euclidean, majority of the `k`
/// nearest (ties: the class with the smaller summed distance, then the
/// lower class index).
pub fn knn_predict(train: &[(&[f64], usize)], x: &[f64], classes: usize, k: usize) -> usize {
    let dims = x.len();
    let mut mean = vec![0.0; dims];
    let mut sd = vec![0.0; dims];
    for d in 0..dims {
        let col: Vec<f64> = train.iter().map(|t| t.0[d]).collect();
        let (m, s) = mean_sd(&col);
        mean[d] = m;
        sd[d] = if s > 1e-12 { s } else { 1.0 };
    }
    let z = |v: &[f64], d: usize| (v[d] - mean[d]) / sd[d];
    let mut dist: Vec<(f64, usize)> = train
        .iter()
        .map(|(v, c)| {
            let d2: f64 = (0..dims).map(|d| (z(v, d) - z(x, d)).powi(2)).sum();
            (d2.sqrt(), *c)
        })
        .collect();
    dist.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut votes = vec![(0usize, 0.0f64); classes];
    for &(d, c) in dist.iter().take(k.max(1)) {
        votes[c].0 += 1;
        votes[c].1 += d;
    }
    (0..classes)
        .max_by(|&a, &b| {
            votes[a]
                .0
                .cmp(&votes[b].0)
                .then(votes[b].1.total_cmp(&votes[a].1))
                .then(b.cmp(&a))
        })
        .unwrap_or(0)
}

/// Cross-validates `clf` on `samples` (features, class).
pub fn cross_validate(
    clf: Classifier,
    samples: &[(SessionFeatures, usize)],
    classes: usize,
    folds: usize,
    seed: u64,
) -> Score {
    let labels: Vec<usize> = samples.iter().map(|s| s.1).collect();
    let (fold, k) = stratified_folds(&labels, classes, folds, seed);
    let mut confusion = vec![vec![0; classes]; classes];
    let mut fold_accuracy = Vec::new();
    for f in 0..k {
        let train: Vec<&(SessionFeatures, usize)> = samples
            .iter()
            .enumerate()
            .filter(|(i, _)| fold[*i] != f)
            .map(|(_, s)| s)
            .collect();
        let (mut right, mut n) = (0, 0);
        let predict: Box<dyn Fn(&SessionFeatures) -> usize> = match clf {
            Classifier::Bitrate => {
                let t = Thresholds::fit(
                    &train.iter().map(|s| (s.0.kbps, s.1)).collect::<Vec<_>>(),
                    classes,
                );
                Box::new(move |x| t.predict(x.kbps))
            }
            Classifier::Burst => {
                let t = Thresholds::fit(
                    &train
                        .iter()
                        .map(|s| (s.0.burst_p50, s.1))
                        .collect::<Vec<_>>(),
                    classes,
                );
                Box::new(move |x| t.predict(x.burst_p50))
            }
            Classifier::Knn => {
                let tv: Vec<(Vec<f64>, usize)> =
                    train.iter().map(|s| (s.0.vector.clone(), s.1)).collect();
                Box::new(move |x| {
                    let refs: Vec<(&[f64], usize)> =
                        tv.iter().map(|(v, c)| (v.as_slice(), *c)).collect();
                    knn_predict(&refs, &x.vector, classes, K)
                })
            }
        };
        for (i, s) in samples.iter().enumerate() {
            if fold[i] != f {
                continue;
            }
            let p = predict(&s.0);
            confusion[s.1][p] += 1;
            n += 1;
            if p == s.1 {
                right += 1;
            }
        }
        if n > 0 {
            fold_accuracy.push(right as f64 / n as f64);
        }
    }
    let total: usize = confusion.iter().flatten().sum();
    let right: usize = (0..classes).map(|c| confusion[c][c]).sum();
    Score {
        classifier: clf.key(),
        accuracy: right as f64 / total.max(1) as f64,
        fold_accuracy,
        confusion,
        samples: total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session of `frames` frames of `size` bytes every 33 ms, in
    /// 1200-byte packets 100 µs apart.
    fn session(size: u32, span_us: u64) -> Vec<(u64, u32)> {
        let mut p = Vec::new();
        let mut t = 0;
        while t < span_us {
            let mut left = size;
            let mut dt = 0;
            while left > 0 {
                let l = left.min(1200);
                p.push((t + dt, l));
                left -= l;
                dt += 100;
            }
            t += 33_333;
        }
        p
    }

    #[test]
    fn features_measure_rate_and_bursts() {
        let f = features(&session(3600, 2_000_000), 2_000_000);
        // 60 frames of 3600 B in 2 s = 864 kbit/s.
        assert!((f.kbps - 864.0).abs() < 20.0, "{}", f.kbps);
        assert_eq!(f.burst_p50, 3600.0);
        assert_eq!(f.vector.len(), FEATURES.len());
        assert_eq!(bursts(&[(0, 10), (1000, 10), (50_000, 5)]), [20.0, 5.0]);
    }

    #[test]
    fn folds_are_stratified_and_seeded() {
        let labels: Vec<usize> = (0..40).map(|i| i % 4).collect();
        let (f, k) = stratified_folds(&labels, 4, 5, 7);
        assert_eq!(k, 5);
        for fold in 0..5 {
            for c in 0..4 {
                let n = (0..40).filter(|&i| f[i] == fold && labels[i] == c).count();
                assert_eq!(n, 2, "fold {fold} class {c}");
            }
        }
        assert_eq!(stratified_folds(&labels, 4, 5, 7).0, f);
        assert_ne!(stratified_folds(&labels, 4, 5, 8).0, f);
        // Three per class: three folds.
        assert_eq!(stratified_folds(&labels[..12], 4, 5, 7).1, 3);
    }

    #[test]
    fn separable_classes_are_found_and_identical_ones_are_chance() {
        let span = 2_000_000;
        let mut rng = SplitMix(1);
        let mut distinct = Vec::new();
        let mut same = Vec::new();
        for c in 0..4usize {
            for _ in 0..10 {
                let jitter = 0.9 + 0.2 * (rng.below(1000) as f64 / 1000.0);
                let size = ((2000 * (c as u32 + 1) * (c as u32 + 1)) as f64 * jitter) as u32;
                distinct.push((features(&session(size, span), span), c));
                same.push((features(&session(5000, span), span), c));
            }
        }
        for clf in Classifier::ALL {
            let s = cross_validate(clf, &distinct, 4, 5, 42);
            assert!(s.accuracy > 0.9, "{clf:?} {}", s.accuracy);
            assert_eq!(s.samples, 40);
            assert_eq!(s.confusion.iter().flatten().sum::<usize>(), 40);
            let s = cross_validate(clf, &same, 4, 5, 42);
            assert!(s.accuracy <= 0.35, "{clf:?} {}", s.accuracy);
        }
    }

    #[test]
    fn thresholds_sit_between_class_medians() {
        let t = Thresholds::fit(&[(800.0, 0), (820.0, 0), (3000.0, 1), (4500.0, 2)], 3);
        let b = t.bounds();
        assert_eq!(b.len(), 2);
        assert!(b[0] > 820.0 && b[0] < 3000.0 && b[1] > 3000.0 && b[1] < 4500.0);
        assert_eq!(t.predict(100.0), 0);
        assert_eq!(t.predict(2900.0), 1);
        assert_eq!(t.predict(9000.0), 2);
    }
}
