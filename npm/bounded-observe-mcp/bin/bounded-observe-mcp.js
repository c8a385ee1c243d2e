#!/usr/bin/env node
// Runs the prebuilt bounded-observe-mcp binary from the platform package npm installed beside this
// one (an optionalDependency whose os/cpu/libc match this machine). Nothing is downloaded and no
// install script runs. The MCP client's pipes are handed to the binary as they are (stdio
// "inherit"), so this launcher never reads or writes a byte of the session: stdout stays the
// wrapped server's alone. SIGINT/SIGTERM/SIGHUP are passed on, and the binary's exit code (or the
// signal that killed it) becomes ours.
'use strict';

const { spawn } = require('node:child_process');
const path = require('node:path');
const os = require('node:os');

// `${process.platform}-${process.arch}` → the platform package holding the binary. Keep in step
// with optionalDependencies in package.json (scripts/package.sh checks both agree).
const PLATFORM_PACKAGES = {
  'linux-x64': '@bounded/observe-mcp-linux-x64-gnu',
  'linux-arm64': '@bounded/observe-mcp-linux-arm64-gnu',
  'darwin-x64': '@bounded/observe-mcp-darwin-x64',
  'darwin-arm64': '@bounded/observe-mcp-darwin-arm64',
  'win32-x64': '@bounded/observe-mcp-win32-x64-msvc',
};

function fail(message) {
  process.stderr.write(`[observe-mcp] ${message}\n`);
  process.exit(1);
}

function binaryPath() {
  const key = `${process.platform}-${process.arch}`;
  const pkg = PLATFORM_PACKAGES[key];
  if (!pkg) {
    fail(`no prebuilt binary for ${key}; build from source with \`cargo install bounded-observe-mcp\``);
  }
  let manifest;
  try {
    manifest = require.resolve(`${pkg}/package.json`);
  } catch {
    fail(
      `the package ${pkg} holding the binary for ${key} is not installed ` +
        '(optional dependencies skipped, e.g. by --omit=optional, or a musl libc, for which no binary is built); ' +
        `reinstall with optional dependencies, or build from source with \`cargo install bounded-observe-mcp\``,
    );
  }
  const exe = process.platform === 'win32' ? 'bounded-observe-mcp.exe' : 'bounded-observe-mcp';
  return path.join(path.dirname(manifest), 'bin', exe);
}

const child = spawn(binaryPath(), process.argv.slice(2), { stdio: 'inherit', windowsHide: true });

const FORWARDED = ['SIGINT', 'SIGTERM', 'SIGHUP'];
const forwarders = new Map();
for (const signal of FORWARDED) {
  const forward = () => {
    // The binary forwards it to the wrapped server in turn; it may have exited meanwhile.
    try {
      child.kill(signal);
    } catch {}
  };
  forwarders.set(signal, forward);
  process.on(signal, forward);
}

child.on('error', (err) => fail(`cannot start ${err.path || 'the binary'}: ${err.message}`));

child.on('exit', (code, signal) => {
  if (signal) {
    // Die of the same signal, so that our parent sees what it would see without this launcher
    // (a shell reports 128+N).
    for (const [sig, forward] of forwarders) process.removeListener(sig, forward);
    try {
      process.kill(process.pid, signal);
    } catch {}
    process.exit(128 + (os.constants.signals[signal] || 0));
  }
  process.exit(code === null ? 1 : code);
});
