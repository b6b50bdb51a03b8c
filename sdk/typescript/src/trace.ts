// OpenTelemetry spans of the calls (the Go twin is the executor's traced handler and
// events/trace.go): "execute_tool <tool>", a child of the step's span whose context the
// call's traceparent carries, with the GenAI conventions' attributes. @opentelemetry/api
// is an optional peer dependency: without it installed there are no spans and nothing
// else changes; with it, spans go to the global tracer provider the application
// registers (none registered: the API's no-op).
import type * as OtelAPI from '@opentelemetry/api';

type API = typeof OtelAPI;
let apiP: Promise<API | null> | undefined;

/** The OpenTelemetry API when it is installed (null otherwise), loaded once. */
export function otel(): Promise<API | null> {
  apiP ??= import('@opentelemetry/api').then((m) => {
    const mod = m as unknown as API & { default?: API };
    return mod.trace ? mod : (mod.default ?? null);
  }, () => null);
  return apiP;
}

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** A span of one call, or one that does nothing. */
export interface CallSpan {
  /** Runs f in the span's context (tools' own spans become its children, with a context manager registered). */
  within<T>(f: () => T): T;
  setAttribute(k: string, v: string | number): void;
  /** Ends the span with the call's result status and error code. */
  end(status: string | undefined, code: string | undefined): void;
}

const none: CallSpan = { within: (f) => f(), setAttribute: () => {}, end: () => {} };

/** Starts the span of a call; traceparent (W3C) is its parent when valid. */
export function startCallSpan(api: API | null, name: string, traceparent: string | undefined, attributes: Record<string, string | number>): CallSpan {
  if (!api) return none;
  let parent = api.context.active();
  const m = traceparent ? TRACEPARENT.exec(traceparent) : null;
  if (m && !/^0+$/.test(m[1]) && !/^0+$/.test(m[2])) {
    parent = api.trace.setSpanContext(parent, { traceId: m[1], spanId: m[2], traceFlags: parseInt(m[3], 16) & 1, isRemote: true });
  }
  const span = api.trace.getTracer('github.com/toolbus/toolbus/sdk/typescript').startSpan(name, { kind: api.SpanKind.INTERNAL, attributes }, parent);
  const ctx = api.trace.setSpan(parent, span);
  return {
    within: (f) => api.context.with(ctx, f),
    setAttribute: (k, v) => span.setAttribute(k, v),
    end: (status, code) => {
      if (status) {
        span.setAttribute('toolbus.tool.status', status);
        if (status !== 'succeeded') {
          span.setAttribute('error.type', code ?? '');
          span.setStatus({ code: api.SpanStatusCode.ERROR, message: code ?? '' });
        }
      }
      span.end();
    },
  };
}
