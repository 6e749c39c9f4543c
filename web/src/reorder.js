// Puts a track's objects back in order when a group is spread over several
// subgroup streams (e.g. keyframes, reference frames and disposable frames
// on streams of their own, as `quichub pub --delivery frame-type` sends):
// objects of the current group leave in Object ID order; a gap (an object
// the relay dropped, or one still in flight) is waited for at most `holdMs`,
// then skipped. A newer group flushes what is held of the older one, and
// objects of older groups are dropped.

export class Reorder {
  /**
   * `deliver(o)` gets each object ({group, objectId, ...}) in order;
   * `now()` and `schedule(fn, ms)` are injectable for tests.
   */
  constructor(deliver, { holdMs = 150, now = () => performance.now(), schedule = (fn, ms) => setTimeout(fn, ms) } = {}) {
    this.deliver = deliver;
    this.holdMs = holdMs;
    this.now = now;
    this.schedule = schedule;
    this.group = -1;
    this.next = 0;
    this.pending = new Map(); // objectId -> [object, arrival]
    this.timer = false;
    this.late = 0; // objects dropped for arriving after their group or turn
    this.skipped = 0; // gaps given up on
  }

  push(o) {
    if (o.group < this.group) {
      this.late++;
      return;
    }
    if (o.group > this.group) {
      this.flush();
      this.group = o.group;
      this.next = 0;
    }
    if (o.objectId < this.next) {
      this.late++;
      return;
    }
    this.pending.set(o.objectId, [o, this.now()]);
    this.drain();
    this.arm();
  }

  drain() {
    while (this.pending.has(this.next)) {
      const [o] = this.pending.get(this.next);
      this.pending.delete(this.next);
      this.next++;
      this.deliver(o);
    }
  }

  /** Delivers everything held, in order, skipping the gaps. */
  flush() {
    const ids = [...this.pending.keys()].sort((a, b) => a - b);
    for (const id of ids) {
      this.deliver(this.pending.get(id)[0]);
      this.next = id + 1;
    }
    if (ids.length) this.skipped++;
    this.pending.clear();
  }

  /** Skips the gap before the oldest held object once it waited holdMs. */
  expire() {
    this.timer = false;
    if (!this.pending.size) return;
    const first = Math.min(...this.pending.keys());
    const [, at] = this.pending.get(first);
    if (this.now() - at >= this.holdMs) {
      this.skipped++;
      this.next = first;
      this.drain();
    }
    this.arm();
  }

  arm() {
    if (this.timer || !this.pending.size) return;
    this.timer = true;
    this.schedule(() => this.expire(), this.holdMs);
  }
}
