// The player's reorder buffer (src/reorder.js). Run: `node --test test/unit/`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Reorder } from '../../src/reorder.js';

function harness() {
  let t = 0;
  const timers = [];
  const out = [];
  const r = new Reorder((o) => out.push(`${o.group}/${o.objectId}`), {
    holdMs: 100,
    now: () => t,
    schedule: (fn, ms) => timers.push([t + ms, fn]),
  });
  const advance = (ms) => {
    t += ms;
    for (;;) {
      const i = timers.findIndex(([at]) => at <= t);
      if (i < 0) break;
      const [[, fn]] = timers.splice(i, 1);
      fn();
    }
  };
  return { r, out, advance, push: (g, id) => r.push({ group: g, objectId: id }) };
}

test('in order: delivered at once', () => {
  const h = harness();
  for (let i = 0; i < 5; i++) h.push(0, i);
  assert.deepEqual(h.out, ['0/0', '0/1', '0/2', '0/3', '0/4']);
});

test('frames of a group on two streams come out in Object ID order', () => {
  const h = harness();
  h.push(3, 1); // subgroup 1's stream overtook the keyframe's
  h.push(3, 2);
  assert.deepEqual(h.out, []);
  h.push(3, 0);
  h.push(3, 4);
  h.push(3, 3);
  assert.deepEqual(h.out, ['3/0', '3/1', '3/2', '3/3', '3/4']);
});

test('a gap is waited for, then skipped', () => {
  const h = harness();
  h.push(0, 0);
  h.push(0, 2);
  h.advance(50);
  assert.deepEqual(h.out, ['0/0']);
  h.advance(60);
  assert.deepEqual(h.out, ['0/0', '0/2']);
  h.push(0, 1); // too late
  assert.equal(h.r.late, 1);
  assert.equal(h.r.skipped, 1);
});

test('a new group flushes the old one; older groups are dropped', () => {
  const h = harness();
  h.push(1, 0);
  h.push(1, 3);
  h.push(2, 0);
  assert.deepEqual(h.out, ['1/0', '1/3', '2/0']);
  h.push(1, 4);
  assert.deepEqual(h.out, ['1/0', '1/3', '2/0']);
  assert.equal(h.r.late, 1);
});
