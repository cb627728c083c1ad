// Node preload (`node -r wall_clock.js ...`) for kinesis-local: its service clock follows the wall clock.
//
// Why: kinesis-local (cats-effect on Node) reads the time of day as performance.timeOrigin + performance.now().
// On Linux performance.now() is CLOCK_MONOTONIC, which stops while the machine or VM is suspended, so after a
// laptop's sleep or a VM's pause every ApproximateArrivalTimestamp (and every AT_TIMESTAMP comparison) lags the
// wall clock by the time asleep, while the responses' Date header does not. Kinesis stamps records with the
// same clock its Date header shows; so does the emulator with this preload. performance.now() stays monotonic
// (durations and timers are unchanged); only the origin is read from the wall clock at each call.
'use strict';

const { performance } = require('perf_hooks');

const monotonicNow = performance.now.bind(performance);
Object.defineProperty(performance, 'timeOrigin', {
  configurable: true,
  enumerable: true,
  get: () => Date.now() - monotonicNow(),
});
