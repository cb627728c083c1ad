// Node preload (`node -r loopback.js ...`) for the local emulators.
//
// Why: kinesis-local always listens on 0.0.0.0; the emulators must only be reachable from this host.
// Every net.Server#listen that names a TCP port (or none) is rewritten to bind 127.0.0.1.
// Unix socket paths and inherited handles are left alone.
//
// SIGTERM exits at once: these emulators hold nothing worth flushing (in memory), and kinesis-local
// otherwise lingers ~30 s after SIGTERM.
//
// Also: when KCL_PIPELINE_PARENT_PID is set, the process exits once that parent is gone, so an
// emulator never outlives the Python process that started it (e.g. a killed test session).
'use strict';

const net = require('net');

const LOOPBACK = '127.0.0.1';
// Captured now: kinesis-local (cats-effect IOApp) replaces process.exit with its slow graceful exit.
const exitNow = process.exit.bind(process);
const originalListen = net.Server.prototype.listen;

function isPort(value) {
  return typeof value === 'number' || (typeof value === 'string' && /^[0-9]+$/.test(value));
}

net.Server.prototype.listen = function listen(...args) {
  const callback = typeof args[args.length - 1] === 'function' ? args.pop() : undefined;
  const first = args[0];
  let options;
  if (first === undefined || first === null) {
    options = { port: 0 };
  } else if (isPort(first)) {
    options = { port: Number(first) };
    // listen(port[, host][, backlog]): the host is dropped, the backlog kept.
    const backlog = args.slice(1).find((a) => typeof a === 'number');
    if (backlog !== undefined) options.backlog = backlog;
  } else if (typeof first === 'object' && first.path === undefined && first.fd === undefined &&
             first._handle === undefined && first.handle === undefined) {
    options = { ...first };
  } else {
    return originalListen.apply(this, callback ? [...args, callback] : args);
  }
  options.host = LOOPBACK;
  return callback ? originalListen.call(this, options, callback) : originalListen.call(this, options);
};

const parentPid = Number(process.env.KCL_PIPELINE_PARENT_PID || 0);
if (parentPid > 0) {
  const timer = setInterval(() => {
    if (process.ppid !== parentPid) exitNow(0);
  }, 1000);
  timer.unref();
}

process.on('SIGTERM', () => exitNow(0));

// dynalite throws from a request's 'error' handler when a client closes its connection before sending the
// whole body (a SIGKILLed worker, a client timeout): uncaught, that exits the emulator. The client has given
// up on that request; drop it and go on serving. Any other uncaught error still ends the process.
process.on('uncaughtException', (err) => {
  if (err && err.code === 'ECONNRESET' && err.message === 'aborted') {
    process.stderr.write('ignored: a client closed its connection in the middle of a request\n');
    return;
  }
  process.stderr.write(`${(err && err.stack) || err}\n`);
  exitNow(1);
});
