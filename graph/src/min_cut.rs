//! A minimum s–t cut (Dinic's maximum flow): how the backward pass's partitioner (`remat`) chooses
//! which forward values to keep for the backward and which to compute again.

use std::collections::VecDeque;

/// A capacity no cut may take: larger than any sum of finite capacities the partitioner builds.
pub(crate) const UNCUTTABLE: u64 = u64::MAX / 4;

/// A flow network over nodes `0..n`.
pub(crate) struct Network {
    /// Per edge: its head, and its residual capacity; edge `e ^ 1` is its reverse.
    head: Vec<usize>,
    room: Vec<u64>,
    /// Per node, the edges leaving it.
    out: Vec<Vec<usize>>,
}

impl Network {
    pub(crate) fn new(n: usize) -> Self {
        Network { head: Vec::new(), room: Vec::new(), out: vec![Vec::new(); n] }
    }

    /// Adds an edge `a → b` of capacity `c`.
    pub(crate) fn edge(&mut self, a: usize, b: usize, c: u64) {
        self.out[a].push(self.head.len());
        self.head.push(b);
        self.room.push(c);
        self.out[b].push(self.head.len());
        self.head.push(a);
        self.room.push(0);
    }

    /// Pushes a maximum flow from `s` to `t` and returns, per node, whether it lies on the source's side
    /// of a minimum cut (reachable from `s` through edges with room left).
    pub(crate) fn min_cut(mut self, s: usize, t: usize) -> Vec<bool> {
        let n = self.out.len();
        loop {
            let level = self.levels(s);
            if level[t] == usize::MAX {
                return level.into_iter().map(|l| l != usize::MAX).collect();
            }
            let mut next = vec![0usize; n];
            while self.augment(s, t, UNCUTTABLE, &level, &mut next) > 0 {}
        }
    }

    /// Breadth-first distances from `s` over edges with room (`usize::MAX`: unreachable).
    fn levels(&self, s: usize) -> Vec<usize> {
        let mut level = vec![usize::MAX; self.out.len()];
        level[s] = 0;
        let mut queue = VecDeque::from([s]);
        while let Some(a) = queue.pop_front() {
            for &e in &self.out[a] {
                let b = self.head[e];
                if self.room[e] > 0 && level[b] == usize::MAX {
                    level[b] = level[a] + 1;
                    queue.push_back(b);
                }
            }
        }
        level
    }

    /// One augmenting path of at most `limit` along increasing levels, found without recursion (a
    /// joint graph's chains are thousands of nodes deep); returns the flow pushed.
    fn augment(&mut self, s: usize, t: usize, limit: u64, level: &[usize], next: &mut [usize]) -> u64 {
        let mut path: Vec<usize> = Vec::new();
        let mut at = s;
        loop {
            if at == t {
                let pushed = path.iter().map(|&e| self.room[e]).min().unwrap_or(0).min(limit);
                for &e in &path {
                    self.room[e] -= pushed;
                    self.room[e ^ 1] += pushed;
                }
                return pushed;
            }
            let mut advanced = false;
            while next[at] < self.out[at].len() {
                let e = self.out[at][next[at]];
                let b = self.head[e];
                if self.room[e] > 0 && level[b] == level[at].wrapping_add(1) {
                    path.push(e);
                    at = b;
                    advanced = true;
                    break;
                }
                next[at] += 1;
            }
            if !advanced {
                // A dead end: retreat, and never try the edge that led here again this phase.
                let Some(e) = path.pop() else { return 0 };
                at = self.head[e ^ 1];
                next[at] += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook network: the cut is the two edges into the sink's side worth 23.
    #[test]
    fn finds_the_minimum_cut() {
        let mut n = Network::new(6);
        for (a, b, c) in [
            (0, 1, 16),
            (0, 2, 13),
            (1, 2, 10),
            (2, 1, 4),
            (1, 3, 12),
            (3, 2, 9),
            (2, 4, 14),
            (4, 3, 7),
            (3, 5, 20),
            (4, 5, 4),
        ] {
            n.edge(a, b, c);
        }
        let side = n.min_cut(0, 5);
        assert_eq!(side, vec![true, true, true, false, true, false]);
    }

    /// An uncuttable edge is never cut: the cut moves to the cheaper finite edges around it.
    #[test]
    fn never_cuts_an_uncuttable_edge() {
        let mut n = Network::new(4);
        n.edge(0, 1, 5);
        n.edge(1, 2, UNCUTTABLE);
        n.edge(2, 3, 7);
        let side = n.min_cut(0, 3);
        assert_eq!(side, vec![true, false, false, false]);
    }
}
