// What an executor learns of ended runs from their outcome events (the Go twin is
// events.RunOutcomes): core subscriptions to toolbus.<run>.run.<terminal status>, so that
// a call of a run that goes on costs no read of the run state.
//
// A subscription only hears what is published while it listens, so it is trusted only
// for runs that started while it listened: the stream's last sequence is recorded once
// the subscriptions are in place (from), and a run whose first run.started has a higher
// sequence started afterwards, so every outcome of that run reached it (an outcome is
// published after its run.started). For any other run, and whenever the subscriptions
// may have missed a message (a reconnection, the map emptied to bound it), the caller
// reads the run state, until a new sequence is recorded.
import type { NatsConnection, Subscription } from '@nats-io/transport-node';
import { Bus, TERMINAL, agreeingRun, decodeEvent } from './wire.js';

export class RunOutcomes {
  private ended = new Map<string, string>();
  private subs: Subscription[] = [];
  private trusted = false;
  private from = 0;
  private epoch = 0;
  private reconnectsAt = 0;
  private refreshing = false;
  private lastTry = 0;
  private refused?: Error;
  /** Called with each run end heard, once recorded (the Go twin's OnEnded). */
  onEnded?: (run: string, status: string) => void;

  /** reconnects counts the connection's reconnections (rings may have been lost at each). */
  constructor(private readonly nc: NatsConnection, private readonly bus: Bus, private readonly reconnects: () => number) {}

  /** Subscribes and records the sequence from which the subscriptions answer; a rejection leaves the caller reading run states. */
  async listen(): Promise<void> {
    for (const status of TERMINAL) {
      const type = `toolbus.run.${status}`;
      this.subs.push(this.nc.subscribe(`toolbus.*.run.${status}`, {
        callback: (err, m) => {
          if (err) {
            this.refused = err;
            return;
          }
          let run: string | undefined;
          try {
            // Only an outcome whose body agrees with its subject ends a run.
            run = agreeingRun(m.subject, decodeEvent<{ run_id?: string }>(m.headers, m.data), type);
          } catch {
            run = undefined;
          }
          if (run) this.record(run, status);
        },
      }));
    }
    await this.refresh();
  }

  private record(run: string, status: string) {
    if (this.ended.size >= 100000) {
      this.ended.clear(); // bounded: forgotten runs are read from the store again
      this.trusted = false;
    }
    this.ended.set(run, status);
    this.onEnded?.(run, status);
  }

  /** Records the stream's last sequence, read once the server has every subscription. */
  private async refresh(): Promise<void> {
    const reconnects = this.reconnects();
    await this.nc.flush();
    if (this.refused || this.subs.some((s) => s.isClosed())) {
      throw new Error(`no permission to subscribe to run outcomes: ${this.refused?.message ?? 'subscription closed'}`);
    }
    const si = await (await this.bus.jsm()).streams.info(this.bus.stream);
    if (!this.subs.length || this.reconnects() !== reconnects) return; // closed, or reconnected meanwhile: the next lookup tries again
    this.trusted = true;
    this.from = si.state.last_seq;
    this.reconnectsAt = reconnects;
    this.epoch++;
  }

  /**
   * The outcome of a run whose first run.started has sequence startSeq ('' while it goes
   * on), or undefined when the subscriptions do not answer for it: the caller reads the
   * run state then.
   */
  lookup(run: string, startSeq: number): string | undefined {
    const status = this.ended.get(run);
    if (status) return status;
    if (this.trusted && this.reconnects() === this.reconnectsAt && !this.refused) return startSeq > this.from ? '' : undefined;
    // Not trusted yet, or messages may have been lost: read the run state until a new sequence is recorded.
    this.trusted = false;
    if (!this.refreshing && this.subs.length && Date.now() - this.lastTry > 1000 && !this.refused) {
      this.refreshing = true;
      this.lastTry = Date.now();
      this.refresh().catch(() => {}).finally(() => (this.refreshing = false));
    }
    return undefined;
  }

  close(): void {
    for (const s of this.subs) s.unsubscribe();
    this.subs = [];
    this.trusted = false;
  }
}
