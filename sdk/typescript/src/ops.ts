// Operations, with the toolbus binary's settings and names so the same probes and
// dashboards see a TypeScript executor: logs like Go's slog on stderr (TOOLBUS_LOG_LEVEL,
// TOOLBUS_LOG_FORMAT), and /healthz, /readyz, /metrics on TOOLBUS_METRICS_ADDR.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Redactor } from './result.js';

const LEVELS = { debug: -4, info: 0, warn: 4, error: 8 } as const;
export type Level = keyof typeof LEVELS;

/** A structured logger: one line per record, text (key=value) or JSON, redacted. */
export class Logger {
  constructor(private readonly level: Level, private readonly format: 'text' | 'json',
    private readonly fields: Record<string, unknown> = {}, private readonly red?: Redactor,
    private readonly out: (line: string) => void = (l) => process.stderr.write(l + '\n')) {}

  with(fields: Record<string, unknown>): Logger {
    return new Logger(this.level, this.format, { ...this.fields, ...fields }, this.red, this.out);
  }

  enabled(level: Level): boolean {
    return LEVELS[level] >= LEVELS[this.level];
  }

  log(level: Level, msg: string, fields: Record<string, unknown> = {}): void {
    if (!this.enabled(level)) return;
    const rec: Record<string, unknown> = { time: new Date().toISOString(), level: level.toUpperCase(), msg, ...this.fields, ...fields };
    let line = this.format === 'json'
      ? JSON.stringify(rec)
      : Object.entries(rec).map(([k, v]) => `${k}=${typeof v === 'string' && v !== '' && !/[\s"=]/.test(v) ? v : JSON.stringify(v)}`).join(' ');
    if (this.red) [line] = this.red.text(line);
    this.out(line);
  }

  debug(msg: string, f?: Record<string, unknown>) { this.log('debug', msg, f); }
  info(msg: string, f?: Record<string, unknown>) { this.log('info', msg, f); }
  warn(msg: string, f?: Record<string, unknown>) { this.log('warn', msg, f); }
  error(msg: string, f?: Record<string, unknown>) { this.log('error', msg, f); }
}

/** The metrics of an executor, with the Go executors' names (package telemetry). */
export class Metrics {
  private calls = new Map<string, number>();
  private durations = new Map<string, { sum: number; count: number }>();
  private inflight = new Map<string, number>();
  private refused = new Map<string, number>();
  poison = 0;
  redeliveries = 0;
  /** Calls that read their run's state (the run outcomes followed did not answer for the run). */
  runStateReads = 0;
  /** Operations the server refused to this process's credentials (permissions violations). */
  permissionDenied = 0;
  /** Writes of calls the core's write service refused over the team's quota (or could not forward) and the executor sent again (not exposed: the log says each). */
  writesRetried = 0;
  /** Tool queues of this process parked (idle: pulling nothing until a call is published for them). */
  queuesParked = 0;
  ready = false;
  connected = false;
  /** Why the process cannot work any more (/healthz fails with it); empty while it can. */
  failed = '';

  callStarted(tool: string) { this.inflight.set(tool, (this.inflight.get(tool) ?? 0) + 1); }
  callStopped(tool: string) { this.inflight.set(tool, (this.inflight.get(tool) ?? 1) - 1); }
  callFinished(tool: string, status: string, code: string, ms: number, ran: boolean) {
    const k = JSON.stringify([tool, status, code]);
    this.calls.set(k, (this.calls.get(k) ?? 0) + 1);
    if (ran) {
      const d = this.durations.get(tool) ?? { sum: 0, count: 0 };
      d.sum += ms / 1000;
      d.count++;
      this.durations.set(tool, d);
    }
  }
  contractRefused(tool: string) { this.refused.set(tool, (this.refused.get(tool) ?? 0) + 1); }

  /** The Prometheus text exposition. */
  text(): string {
    const l: string[] = [];
    const esc = (s: string) => s.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');
    l.push('# HELP toolbus_tool_calls_total Tool calls finished, by tool, status and error code.', '# TYPE toolbus_tool_calls_total counter');
    for (const [k, n] of this.calls) {
      const [tool, status, code] = JSON.parse(k);
      l.push(`toolbus_tool_calls_total{code="${esc(code)}",status="${esc(status)}",tool="${esc(tool)}"} ${n}`);
    }
    l.push('# HELP toolbus_tool_call_duration_seconds How long tools ran.', '# TYPE toolbus_tool_call_duration_seconds summary');
    for (const [tool, d] of this.durations) {
      l.push(`toolbus_tool_call_duration_seconds_sum{tool="${esc(tool)}"} ${d.sum}`, `toolbus_tool_call_duration_seconds_count{tool="${esc(tool)}"} ${d.count}`);
    }
    l.push('# HELP toolbus_tool_calls_in_flight Tool calls running.', '# TYPE toolbus_tool_calls_in_flight gauge');
    for (const [tool, n] of this.inflight) l.push(`toolbus_tool_calls_in_flight{tool="${esc(tool)}"} ${n}`);
    l.push('# HELP toolbus_tool_contract_refused_total Contracts the catalog refused.', '# TYPE toolbus_tool_contract_refused_total counter');
    for (const [tool, n] of this.refused) l.push(`toolbus_tool_contract_refused_total{tool="${esc(tool)}"} ${n}`);
    l.push('# HELP toolbus_poison_terminated_total Messages terminated as poison.', '# TYPE toolbus_poison_terminated_total counter',
      `toolbus_poison_terminated_total{role="executor"} ${this.poison}`);
    l.push('# HELP toolbus_redeliveries_total Redelivered messages taken.', '# TYPE toolbus_redeliveries_total counter',
      `toolbus_redeliveries_total{role="executor"} ${this.redeliveries}`);
    l.push('# HELP toolbus_permission_denied_total Operations the server refused to this process\'s credentials (permissions violations).',
      '# TYPE toolbus_permission_denied_total counter', `toolbus_permission_denied_total ${this.permissionDenied}`);
    l.push('# HELP toolbus_tool_queues_parked Tool queues parked: idle, pulling nothing until a call is published for them.',
      '# TYPE toolbus_tool_queues_parked gauge', `toolbus_tool_queues_parked ${this.queuesParked}`);
    l.push('# HELP toolbus_ready Whether the role is connected and serving.', '# TYPE toolbus_ready gauge',
      `toolbus_ready{role="executor"} ${this.ready && this.connected ? 1 : 0}`);
    return l.join('\n') + '\n';
  }
}

/** Serves /healthz, /readyz and /metrics on addr (host:port); resolves with the bound address. */
export function serveMetrics(addr: string, m: Metrics, log: Logger): Promise<http.Server> {
  const at = addr.lastIndexOf(':');
  const host = addr.slice(0, at) || '127.0.0.1';
  const port = Number(addr.slice(at + 1));
  const srv = http.createServer((req, res) => {
    if (req.method !== 'GET') return res.writeHead(405).end();
    if (req.url === '/healthz') return m.failed ? res.writeHead(503).end(`failed: ${m.failed}\n`) : res.writeHead(200).end('ok\n');
    if (req.url === '/readyz') {
      if (!m.connected) return res.writeHead(503).end('not connected to NATS\n');
      if (!m.ready) return res.writeHead(503).end('consumers not bound: executor\n');
      return res.writeHead(200).end('ready\n');
    }
    if (req.url === '/metrics') return res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(m.text());
    return res.writeHead(404).end();
  });
  srv.unref();
  return new Promise((resolve, reject) => {
    srv.once('error', reject);
    srv.listen(port, host, () => {
      const a = srv.address() as AddressInfo;
      log.info('metrics serving', { addr: `${a.address}:${a.port}`, paths: '/metrics /healthz /readyz' });
      resolve(srv);
    });
  });
}
