/*
 * loadgen - AMQP 0-9-1 load generator for benchmarking Warren vs RabbitMQ.
 *
 * One binary, three roles (run publisher and consumers as separate processes):
 *
 *   loadgen setup   [opts]   declare/delete/purge/bind queues and exchanges
 *   loadgen publish [opts]   publish messages, optionally in confirm mode
 *   loadgen consume [opts]   consume messages, verify exactly-once, latency
 *   loadgen count   [opts]   passive queue.declare: message count, or wait
 *                            (reconnecting) until it reaches --count N
 *   loadgen bulk    [opts]   N queue.declare/bind/unbind/delete, pipelined,
 *                            each phase timed (topology scaling)
 *
 * Names, routing keys, message headers and binding arguments can be
 * templates with a counter ({seq}, {seq%M}, {seq+C}; see render()), for a
 * new routing key per message or many distinct bindings.
 *
 * Message body layout (little endian, body size >= 16):
 *   bytes 0..7   sequence number (0, 1, 2, ...)
 *   bytes 8..15  send timestamp, CLOCK_MONOTONIC in ns
 *   bytes 16..   filler
 * After the last message the publisher sends an end marker (seq = 2^64-1,
 * second word = number of messages sent) so a consumer knows how many
 * messages to expect and can stop without guessing.
 *
 * Stream queues (setup --queue-type stream): a consumer may start anywhere
 * (consume --stream-offset), and several consumers read the same messages.
 * Each consumer process checks its own deliveries; one that starts at offset
 * K of a stream one publisher filled from empty expects exactly the messages
 * K..N-1 and the marker (--expect-from K), and --check-offsets verifies every
 * delivery's x-stream-offset header against its sequence number.
 *
 * Results are printed as one JSON line on stdout; diagnostics go to stderr.
 *
 * Performance notes (the load generator must not be the bottleneck on a
 * 2-core box where it shares the CPU with the broker):
 *  - publish: by default basic.publish frames are encoded by hand from a
 *    per-message template and written to the socket in batches (~64 KiB per
 *    send()), instead of 3 send() calls per message in amqp_basic_publish().
 *    --lib-publish switches to amqp_basic_publish() for cross-checking.
 *    Confirms (basic.ack/nack) are read with amqp_simple_wait_frame_noblock()
 *    once per batch, or with a timeout while the confirm window is full.
 *  - consume: frames are read with amqp_simple_wait_frame_noblock() (with a
 *    timeout) straight out of librabbitmq's 128 KiB read buffer; no per
 *    message malloc/free.  --lib-consume switches to amqp_consume_message()
 *    for cross-checking.  Manual acks use multiple=true every K messages.
 *  - latencies go to a fixed-size log-linear histogram (~1.6% resolution).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/framing.h>
#include <rabbitmq-c/tcp_socket.h>
#else
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#endif
#else
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#endif

#define END_MARKER UINT64_MAX
#define MAX_QUEUES 64
#define MAX_TMPL 16 /* --key-template / --header / --bind-arg, each */

/* ------------------------------------------------------------------ */
/* utilities                                                           */

static const char *g_role = "loadgen";
static volatile sig_atomic_t g_stop = 0;

static void on_signal(int sig) {
  (void)sig;
  g_stop = 1;
}

__attribute__((noreturn, format(printf, 1, 2)))
static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: error: ", g_role);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(2);
}

static void note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", g_role);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
}

static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct timeval ns_to_tv(uint64_t ns) {
  struct timeval tv;
  tv.tv_sec = (time_t)(ns / 1000000000ull);
  tv.tv_usec = (suseconds_t)((ns % 1000000000ull) / 1000);
  return tv;
}

static inline void put_u64le(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t get_u64le(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static inline void put_u16be(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}
static inline void put_u32be(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}
static inline void put_u64be(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (56 - 8 * i));
}

/* ------------------------------------------------------------------ */
/* log-linear histogram of nanosecond values                           */

#define H_SUB_BITS 6
#define H_SUB (1 << H_SUB_BITS)
#define H_BUCKETS (H_SUB * 60)

typedef struct {
  uint64_t c[H_BUCKETS];
  uint64_t n, min, max;
  double sum;
} hist_t;

static void hist_init(hist_t *h) {
  memset(h, 0, sizeof(*h));
  h->min = UINT64_MAX;
}

static inline int hist_idx(uint64_t v) {
  if (v < H_SUB) return (int)v;
  int e = 63 - __builtin_clzll(v); /* >= H_SUB_BITS */
  int sub = (int)((v >> (e - H_SUB_BITS)) & (H_SUB - 1));
  int idx = (e - H_SUB_BITS + 1) * H_SUB + sub;
  return idx < H_BUCKETS ? idx : H_BUCKETS - 1;
}

static double hist_mid(int idx) {
  if (idx < H_SUB) return (double)idx;
  int e = idx / H_SUB + H_SUB_BITS - 1;
  int sub = idx % H_SUB;
  double w = ldexp(1.0, e - H_SUB_BITS);
  return ((double)(H_SUB + sub) + 0.5) * w;
}

static inline void hist_add(hist_t *h, uint64_t v) {
  h->c[hist_idx(v)]++;
  h->n++;
  h->sum += (double)v;
  if (v < h->min) h->min = v;
  if (v > h->max) h->max = v;
}

static double hist_pct(const hist_t *h, double p) {
  if (!h->n) return 0;
  uint64_t want = (uint64_t)ceil(p * (double)h->n);
  if (want < 1) want = 1;
  uint64_t acc = 0;
  for (int i = 0; i < H_BUCKETS; i++) {
    acc += h->c[i];
    if (acc >= want) {
      double m = hist_mid(i);
      if (m > (double)h->max) m = (double)h->max;
      if (m < (double)h->min) m = (double)h->min;
      return m;
    }
  }
  return (double)h->max;
}

/* prints "name":{...} in microseconds */
static void hist_json(FILE *f, const char *name, const hist_t *h) {
  if (!h->n) {
    fprintf(f, "\"%s\":null", name);
    return;
  }
  fprintf(f,
          "\"%s\":{\"n\":%" PRIu64
          ",\"p50_us\":%.1f,\"p90_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,"
          "\"min_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.1f}",
          name, h->n, hist_pct(h, 0.50) / 1e3, hist_pct(h, 0.90) / 1e3,
          hist_pct(h, 0.99) / 1e3, hist_pct(h, 0.999) / 1e3,
          (double)h->min / 1e3, (double)h->max / 1e3,
          h->sum / (double)h->n / 1e3);
}

/* ------------------------------------------------------------------ */
/* options                                                              */

typedef struct {
  const char *host;
  int port;
  const char *user, *pass, *vhost;
  int frame_max;
  double connect_timeout;

  /* publish */
  const char *exchange;
  const char *routing_key;
  size_t size;
  uint64_t count;   /* 0 = unlimited */
  double seconds;   /* 0 = unlimited */
  int confirm;
  int window;
  int persistent;
  double rate;      /* msg/s, 0 = unlimited */
  size_t batch_bytes;
  int lib_publish;
  int no_marker;
  int sndbuf;
  double confirm_timeout; /* wait for outstanding confirms at the end */

  /* consume */
  const char *queue;
  int prefetch;
  int ack_every; /* 0 = auto-ack (no_ack=true) */
  double idle_timeout;
  double grace;
  const char *ready_file;
  int lib_consume;
  const char *stream_offset; /* x-stream-offset consumer argument, or NULL */
  uint64_t expect_from;      /* first sequence number this consumer should get */
  int check_offsets;         /* x-stream-offset header must equal the seq */

  /* setup */
  const char *queues[MAX_QUEUES];
  int nqueues;
  const char *exchange_type;
  const char *queue_type; /* x-queue-type argument, or NULL */
  int durable;
  int do_delete;
  int do_purge;
  int do_bind;
  int quiet;

  /* templated names (see render()): publish and bulk */
  const char *key_tmpl[MAX_TMPL];
  const char *message_id_tmpl;
  int nkey_tmpl;
  const char *headers[MAX_TMPL];   /* publish: K=V message headers */
  int nheaders;
  const char *bind_args[MAX_TMPL]; /* bulk: K=V queue.bind arguments */
  int nbind_args;
  /* bulk */
  const char *ops;
  const char *queue_tmpl;
  uint64_t start;
} opts_t;

static void usage(void) {
  fprintf(stderr,
"usage: loadgen setup|publish|consume|count|bulk [options]\n"
"common:  --host H (127.0.0.1) --port P (5672) --user U --pass P --vhost V\n"
"         --frame-max N (131072) --connect-timeout S (10)\n"
"setup:   --queue Q (repeatable) [--durable] [--exchange X --exchange-type T]\n"
"         [--bind [--routing-key K]] [--purge] [--delete]\n"
"         --queue-type T (x-queue-type argument: classic, quorum, stream;\n"
"         quorum queues and streams need --durable)\n"
"         --delete deletes the named queues/exchange (if-unused=false) and exits\n"
"publish: --exchange X ('') --routing-key K (default: --queue) --size N (16)\n"
"         --count N (0=unlimited) --seconds S (0=unlimited; one of them needed)\n"
"         --confirm [--window N (1000)] --persistent --rate MSG_PER_S (0)\n"
"         --batch-bytes N (65536) --sndbuf BYTES (262144; 0=kernel default)\n"
"         --lib-publish --no-marker\n"
"         --confirm-timeout S (30; give up after S s without a confirm while the window\n"
"         is full, or with the broker reading nothing, or waiting at the end)\n"
"         --key-template T (a new routing key per message, see below)\n"
"         --header K=V (repeatable; string message headers, V may be a template)\n"
"         --message-id T (the message_id property, a template)\n"
"consume: --queue Q --prefetch N (0) --auto-ack | --ack-every K (multiple=true)\n"
"         --count N (stop after N unique messages) --seconds S (hard deadline)\n"
"         --idle-timeout S (10; stop after S without deliveries, once started)\n"
"         --grace S (2; after the end marker, wait for stragglers)\n"
"         --ready-file PATH (created once consuming) --lib-consume\n"
"         --stream-offset SPEC (x-stream-offset consumer argument: first, last,\n"
"         next, ... as a long string; an integer as a signed 64-bit long)\n"
"         --expect-from K (expect exactly the messages K..N-1, N from the end\n"
"         marker; a message below K counts as unexpected)\n"
"         --check-offsets (every delivery's x-stream-offset header must equal its\n"
"         sequence number, the marker's the number of messages: a stream that one\n"
"         publisher filled from empty)\n"
"count:   --queue Q [--count N --seconds S]: passive queue.declare; with --count,\n"
"         retry (reconnecting, every 10 ms) until message_count >= N or S seconds\n"
"         pass; exit 0 when reached, 1 when not. Times are CLOCK_MONOTONIC ns\n"
"bulk:    --count N --ops declare,bind,unbind,delete (phases, in order, each timed)\n"
"         --queue-template T | --queue Q  --exchange X (for bind/unbind)\n"
"         [--key-template T ...] (binding i uses template i %% #T with {seq} = i / #T;\n"
"         default: the queue name) [--bind-arg K=V ...] [--durable] [--start I (0)]\n"
"         --window W (1000 requests in flight; 1 = one RPC at a time)\n"
"         --seconds S (give up after S s: exit 4, phase marked timed_out)\n"
"templates: {seq}, {seq%%M}, {seq+C}, {seq%%M+C} are replaced by the message's\n"
"         sequence number (bulk: the binding/queue index) mod M plus C\n");
  exit(1);
}

enum {
  O_HOST = 1000, O_PORT, O_USER, O_PASS, O_VHOST, O_FRAME_MAX, O_CONN_TO,
  O_EXCHANGE, O_RKEY, O_SIZE, O_COUNT, O_SECONDS, O_CONFIRM, O_WINDOW,
  O_PERSISTENT, O_RATE, O_BATCH, O_LIBPUB, O_NOMARKER, O_CONFIRM_TO,
  O_QUEUE, O_PREFETCH, O_AUTOACK, O_ACKEVERY, O_IDLE, O_GRACE, O_READY,
  O_LIBCONS, O_SNDBUF, O_XTYPE, O_DURABLE, O_DELETE, O_PURGE, O_BIND, O_QUIET, O_HELP,
  O_KEY_TMPL, O_HEADER, O_MSGID, O_BIND_ARG, O_OPS, O_QUEUE_TMPL, O_START,
  O_QTYPE, O_STREAM_OFFSET, O_EXPECT_FROM, O_CHECK_OFFSETS
};

static struct option long_opts[] = {
    {"host", required_argument, 0, O_HOST},
    {"port", required_argument, 0, O_PORT},
    {"user", required_argument, 0, O_USER},
    {"pass", required_argument, 0, O_PASS},
    {"vhost", required_argument, 0, O_VHOST},
    {"frame-max", required_argument, 0, O_FRAME_MAX},
    {"connect-timeout", required_argument, 0, O_CONN_TO},
    {"exchange", required_argument, 0, O_EXCHANGE},
    {"routing-key", required_argument, 0, O_RKEY},
    {"size", required_argument, 0, O_SIZE},
    {"count", required_argument, 0, O_COUNT},
    {"seconds", required_argument, 0, O_SECONDS},
    {"confirm", no_argument, 0, O_CONFIRM},
    {"window", required_argument, 0, O_WINDOW},
    {"persistent", no_argument, 0, O_PERSISTENT},
    {"rate", required_argument, 0, O_RATE},
    {"batch-bytes", required_argument, 0, O_BATCH},
    {"lib-publish", no_argument, 0, O_LIBPUB},
    {"no-marker", no_argument, 0, O_NOMARKER},
    {"confirm-timeout", required_argument, 0, O_CONFIRM_TO},
    {"queue", required_argument, 0, O_QUEUE},
    {"prefetch", required_argument, 0, O_PREFETCH},
    {"auto-ack", no_argument, 0, O_AUTOACK},
    {"ack-every", required_argument, 0, O_ACKEVERY},
    {"idle-timeout", required_argument, 0, O_IDLE},
    {"grace", required_argument, 0, O_GRACE},
    {"ready-file", required_argument, 0, O_READY},
    {"lib-consume", no_argument, 0, O_LIBCONS},
    {"sndbuf", required_argument, 0, O_SNDBUF},
    {"exchange-type", required_argument, 0, O_XTYPE},
    {"durable", no_argument, 0, O_DURABLE},
    {"delete", no_argument, 0, O_DELETE},
    {"purge", no_argument, 0, O_PURGE},
    {"bind", no_argument, 0, O_BIND},
    {"quiet", no_argument, 0, O_QUIET},
    {"help", no_argument, 0, O_HELP},
    {"key-template", required_argument, 0, O_KEY_TMPL},
    {"header", required_argument, 0, O_HEADER},
    {"message-id", required_argument, 0, O_MSGID},
    {"bind-arg", required_argument, 0, O_BIND_ARG},
    {"ops", required_argument, 0, O_OPS},
    {"queue-template", required_argument, 0, O_QUEUE_TMPL},
    {"start", required_argument, 0, O_START},
    {"queue-type", required_argument, 0, O_QTYPE},
    {"stream-offset", required_argument, 0, O_STREAM_OFFSET},
    {"expect-from", required_argument, 0, O_EXPECT_FROM},
    {"check-offsets", no_argument, 0, O_CHECK_OFFSETS},
    {0, 0, 0, 0}};

static uint64_t parse_u64(const char *s, const char *what) {
  char *end;
  errno = 0;
  double d = strtod(s, &end); /* accept 1e6 */
  if (errno || end == s || *end || d < 0) die("bad %s: %s", what, s);
  return (uint64_t)d;
}
static double parse_dbl(const char *s, const char *what) {
  char *end;
  errno = 0;
  double d = strtod(s, &end);
  if (errno || end == s || *end || d < 0) die("bad %s: %s", what, s);
  return d;
}

static void parse_opts(opts_t *o, int argc, char **argv) {
  memset(o, 0, sizeof(*o));
  o->host = "127.0.0.1";
  o->port = 5672;
  o->user = "guest";
  o->pass = "guest";
  o->vhost = "/";
  o->frame_max = 131072;
  o->connect_timeout = 10;
  o->exchange = "";
  o->size = 16;
  o->window = 1000;
  o->batch_bytes = 65536;
  o->sndbuf = 262144;
  o->confirm_timeout = 30;
  o->idle_timeout = 10;
  o->grace = 2;
  o->exchange_type = "direct";
  int c;
  while ((c = getopt_long(argc, argv, "", long_opts, NULL)) != -1) {
    switch (c) {
      case O_HOST: o->host = optarg; break;
      case O_PORT: o->port = (int)parse_u64(optarg, "port"); break;
      case O_USER: o->user = optarg; break;
      case O_PASS: o->pass = optarg; break;
      case O_VHOST: o->vhost = optarg; break;
      case O_FRAME_MAX: o->frame_max = (int)parse_u64(optarg, "frame-max"); break;
      case O_CONN_TO: o->connect_timeout = parse_dbl(optarg, "connect-timeout"); break;
      case O_EXCHANGE: o->exchange = optarg; break;
      case O_RKEY: o->routing_key = optarg; break;
      case O_SIZE: o->size = (size_t)parse_u64(optarg, "size"); break;
      case O_COUNT: o->count = parse_u64(optarg, "count"); break;
      case O_SECONDS: o->seconds = parse_dbl(optarg, "seconds"); break;
      case O_CONFIRM: o->confirm = 1; break;
      case O_WINDOW: o->window = (int)parse_u64(optarg, "window"); break;
      case O_PERSISTENT: o->persistent = 1; break;
      case O_RATE: o->rate = parse_dbl(optarg, "rate"); break;
      case O_BATCH: o->batch_bytes = (size_t)parse_u64(optarg, "batch-bytes"); break;
      case O_LIBPUB: o->lib_publish = 1; break;
      case O_NOMARKER: o->no_marker = 1; break;
      case O_CONFIRM_TO: o->confirm_timeout = parse_dbl(optarg, "confirm-timeout"); break;
      case O_QUEUE:
        if (o->nqueues >= MAX_QUEUES) die("too many --queue");
        o->queues[o->nqueues++] = optarg;
        o->queue = o->queues[0];
        break;
      case O_PREFETCH: o->prefetch = (int)parse_u64(optarg, "prefetch"); break;
      case O_AUTOACK: o->ack_every = 0; break;
      case O_ACKEVERY: o->ack_every = (int)parse_u64(optarg, "ack-every"); break;
      case O_IDLE: o->idle_timeout = parse_dbl(optarg, "idle-timeout"); break;
      case O_GRACE: o->grace = parse_dbl(optarg, "grace"); break;
      case O_READY: o->ready_file = optarg; break;
      case O_LIBCONS: o->lib_consume = 1; break;
      case O_SNDBUF: o->sndbuf = (int)parse_u64(optarg, "sndbuf"); break;
      case O_XTYPE: o->exchange_type = optarg; break;
      case O_DURABLE: o->durable = 1; break;
      case O_DELETE: o->do_delete = 1; break;
      case O_PURGE: o->do_purge = 1; break;
      case O_BIND: o->do_bind = 1; break;
      case O_QUIET: o->quiet = 1; break;
      case O_KEY_TMPL:
        if (o->nkey_tmpl >= MAX_TMPL) die("too many --key-template");
        o->key_tmpl[o->nkey_tmpl++] = optarg;
        break;
      case O_HEADER:
        if (o->nheaders >= MAX_TMPL) die("too many --header");
        if (!strchr(optarg, '=')) die("--header needs K=V: %s", optarg);
        o->headers[o->nheaders++] = optarg;
        break;
      case O_MSGID: o->message_id_tmpl = optarg; break;
      case O_BIND_ARG:
        if (o->nbind_args >= MAX_TMPL) die("too many --bind-arg");
        if (!strchr(optarg, '=')) die("--bind-arg needs K=V: %s", optarg);
        o->bind_args[o->nbind_args++] = optarg;
        break;
      case O_OPS: o->ops = optarg; break;
      case O_QUEUE_TMPL: o->queue_tmpl = optarg; break;
      case O_START: o->start = parse_u64(optarg, "start"); break;
      case O_QTYPE: o->queue_type = optarg; break;
      case O_STREAM_OFFSET: o->stream_offset = optarg; break;
      case O_EXPECT_FROM: o->expect_from = parse_u64(optarg, "expect-from"); break;
      case O_CHECK_OFFSETS: o->check_offsets = 1; break;
      default: usage();
    }
  }
  if (optind != argc) usage();
}

/* ------------------------------------------------------------------ */
/* templates: names, routing keys and header values with a counter      */

/* Copies template t to out, replacing {seq}, {seq%M}, {seq+C} and {seq%M+C}
 * by (seq mod M) + C. Any other text, braces included, is copied as is.
 * Returns the length; dies if the result does not fit in cap - 1 bytes. */
static size_t render(const char *t, uint64_t seq, char *out, size_t cap) {
  size_t n = 0;
  const char *s = t;
  while (*s) {
    if (!strncmp(s, "{seq", 4) && (s[4] == '}' || s[4] == '%' || s[4] == '+')) {
      const char *q = s + 4;
      char *end;
      uint64_t v = seq;
      if (*q == '%') {
        uint64_t m = strtoull(q + 1, &end, 10);
        if (end == q + 1 || m == 0) die("bad modulus in template %s", t);
        v %= m;
        q = end;
      }
      if (*q == '+') {
        uint64_t c = strtoull(q + 1, &end, 10);
        if (end == q + 1) die("bad offset in template %s", t);
        v += c;
        q = end;
      }
      if (*q != '}') die("bad placeholder in template %s", t);
      int k = snprintf(out + n, cap - n, "%" PRIu64, v);
      if (k < 0 || (size_t)k >= cap - n) die("template result too long: %s", t);
      n += (size_t)k;
      s = q + 1;
    } else {
      if (n + 1 >= cap) die("template result too long: %s", t);
      out[n++] = *s++;
    }
  }
  out[n] = 0;
  return n;
}

/* A field table of string values rendered from K=V templates. */
typedef struct {
  amqp_table_entry_t e[MAX_TMPL];
  char val[MAX_TMPL][256];
  amqp_table_t t;
} kvtab_t;

static void kv_render(kvtab_t *kv, const char *const *pairs, int n, uint64_t seq) {
  for (int i = 0; i < n; i++) {
    const char *eq = strchr(pairs[i], '=');
    kv->e[i].key.bytes = (void *)pairs[i];
    kv->e[i].key.len = (size_t)(eq - pairs[i]);
    size_t len = render(eq + 1, seq, kv->val[i], sizeof(kv->val[i]));
    kv->e[i].value.kind = AMQP_FIELD_KIND_UTF8; /* 'S', a long string */
    kv->e[i].value.value.bytes.bytes = kv->val[i];
    kv->e[i].value.value.bytes.len = len;
  }
  kv->t.num_entries = n;
  kv->t.entries = kv->e;
}

/* Encodes a method frame on channel ch into dst; returns its length. */
static size_t put_method_frame(uint8_t *dst, size_t cap, uint16_t ch,
                               amqp_method_number_t id, void *m) {
  if (cap < 64) die("frame buffer too small");
  amqp_bytes_t enc = {cap - 12, dst + 11};
  /* returns the encoded length (the header comment says 0; the code and
   * librabbitmq's own callers use the length) */
  int n = amqp_encode_method(id, m, enc);
  if (n < 0) die("encoding %s: %s", amqp_method_name(id), amqp_error_string2(n));
  dst[0] = AMQP_FRAME_METHOD;
  put_u16be(dst + 1, ch);
  put_u32be(dst + 3, (uint32_t)(4 + n));
  put_u32be(dst + 7, id);
  dst[11 + n] = AMQP_FRAME_END;
  return 12 + (size_t)n;
}

/* Encodes a basic content header frame on channel ch into dst. */
static size_t put_header_frame(uint8_t *dst, size_t cap, uint16_t ch, uint64_t body_size,
                               amqp_basic_properties_t *props) {
  if (cap < 64) die("frame buffer too small");
  amqp_bytes_t enc = {cap - 20, dst + 19};
  int n = amqp_encode_properties(AMQP_BASIC_CLASS, props, enc);
  if (n < 0) die("encoding properties: %s", amqp_error_string2(n));
  dst[0] = AMQP_FRAME_HEADER;
  put_u16be(dst + 1, ch);
  put_u32be(dst + 3, (uint32_t)(12 + n));
  put_u16be(dst + 7, AMQP_BASIC_CLASS);
  put_u16be(dst + 9, 0); /* weight */
  put_u64be(dst + 11, body_size);
  dst[19 + n] = AMQP_FRAME_END;
  return 20 + (size_t)n;
}

/* ------------------------------------------------------------------ */
/* connection helpers                                                   */

static void check_reply(amqp_rpc_reply_t r, const char *ctx) {
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return;
    case AMQP_RESPONSE_NONE:
      die("%s: missing RPC reply type", ctx);
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      die("%s: %s", ctx, amqp_error_string2(r.library_error));
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        amqp_connection_close_t *m = (amqp_connection_close_t *)r.reply.decoded;
        die("%s: server connection error %u: %.*s", ctx, m->reply_code,
            (int)m->reply_text.len, (char *)m->reply_text.bytes);
      } else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        amqp_channel_close_t *m = (amqp_channel_close_t *)r.reply.decoded;
        die("%s: server channel error %u: %.*s", ctx, m->reply_code,
            (int)m->reply_text.len, (char *)m->reply_text.bytes);
      }
      die("%s: unknown server error, method id 0x%08X", ctx, r.reply.id);
  }
  die("%s: bad reply", ctx);
}

static void check_status(int status, const char *ctx) {
  if (status < 0) die("%s: %s", ctx, amqp_error_string2(status));
}

/* blocked_cap: announce the connection.blocked capability (the publisher: a broker whose
 * resource alarm holds it back then says so, where it would otherwise just stop reading). */
static amqp_connection_state_t connect_broker_as(const opts_t *o, int *fd_out, int blocked_cap) {
  amqp_connection_state_t conn = amqp_new_connection();
  if (!conn) die("amqp_new_connection failed");
  amqp_socket_t *sock = amqp_tcp_socket_new(conn);
  if (!sock) die("amqp_tcp_socket_new failed");
  struct timeval tv = ns_to_tv((uint64_t)(o->connect_timeout * 1e9));
  int st = amqp_socket_open_noblock(sock, o->host, o->port, &tv);
  if (st != AMQP_STATUS_OK)
    die("connect %s:%d: %s", o->host, o->port, amqp_error_string2(st));
  amqp_set_handshake_timeout(conn, &tv);
  struct timeval rpc_tv = {30, 0};
  amqp_set_rpc_timeout(conn, &rpc_tv);
  /* librabbitmq merges these capabilities into its own (which lack connection.blocked) */
  amqp_table_entry_t cap = {.key = amqp_cstring_bytes("connection.blocked"),
                            .value = {.kind = AMQP_FIELD_KIND_BOOLEAN, .value = {.boolean = 1}}};
  amqp_table_entry_t prop = {.key = amqp_cstring_bytes("capabilities"),
                             .value = {.kind = AMQP_FIELD_KIND_TABLE, .value = {.table = {1, &cap}}}};
  amqp_table_t props = {1, &prop};
  check_reply(amqp_login_with_properties(conn, o->vhost, 0, o->frame_max, 0 /* no heartbeat */,
                                         blocked_cap ? &props : &amqp_empty_table,
                                         AMQP_SASL_METHOD_PLAIN, o->user, o->pass),
              "login");
  amqp_channel_open(conn, 1);
  check_reply(amqp_get_rpc_reply(conn), "channel.open");
  int fd = amqp_get_sockfd(conn);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0 && !(fl & O_NONBLOCK)) fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  if (fd_out) *fd_out = fd;
  return conn;
}

static amqp_connection_state_t connect_broker(const opts_t *o, int *fd_out) {
  return connect_broker_as(o, fd_out, 0);
}

static void close_broker(amqp_connection_state_t conn) {
  /* best effort; ignore errors */
  struct timeval tv = {10, 0};
  amqp_set_rpc_timeout(conn, &tv);
  amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
  amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn);
}

/* Handle a method frame that is not part of the normal flow. Returns 1 if it
 * was a fatal close (never returns in that case), 0 if ignored. */
static void fatal_close(amqp_connection_state_t conn, amqp_frame_t *f) {
  if (f->payload.method.id == AMQP_CHANNEL_CLOSE_METHOD) {
    amqp_channel_close_t *m = (amqp_channel_close_t *)f->payload.method.decoded;
    amqp_channel_close_ok_t ok;
    amqp_send_method(conn, f->channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
    die("channel closed by server: %u %.*s", m->reply_code,
        (int)m->reply_text.len, (char *)m->reply_text.bytes);
  }
  if (f->payload.method.id == AMQP_CONNECTION_CLOSE_METHOD) {
    amqp_connection_close_t *m =
        (amqp_connection_close_t *)f->payload.method.decoded;
    amqp_connection_close_ok_t ok;
    amqp_send_method(conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
    die("connection closed by server: %u %.*s", m->reply_code,
        (int)m->reply_text.len, (char *)m->reply_text.bytes);
  }
}

/* ------------------------------------------------------------------ */
/* setup                                                                */

static int cmd_setup(opts_t *o) {
  g_role = "loadgen setup";
  amqp_connection_state_t conn = connect_broker(o, NULL);
  int have_x = o->exchange && o->exchange[0];
  if (o->do_delete) {
    for (int i = 0; i < o->nqueues; i++) {
      amqp_queue_delete(conn, 1, amqp_cstring_bytes(o->queues[i]), 0, 0);
      amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
      if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        /* deleting a missing queue is not an error in 0-9-1, but be lenient
         * with brokers that close the channel: reopen and go on */
        note("queue.delete %s failed", o->queues[i]);
        amqp_channel_open(conn, 1);
        check_reply(amqp_get_rpc_reply(conn), "channel.open");
      }
    }
    if (have_x) {
      amqp_exchange_delete(conn, 1, amqp_cstring_bytes(o->exchange), 0);
      amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
      if (r.reply_type != AMQP_RESPONSE_NORMAL) note("exchange.delete failed");
    }
    close_broker(conn);
    if (!o->quiet) printf("{\"role\":\"setup\",\"deleted\":%d}\n", o->nqueues);
    return 0;
  }
  if (have_x) {
    amqp_exchange_declare(conn, 1, amqp_cstring_bytes(o->exchange),
                          amqp_cstring_bytes(o->exchange_type), 0, o->durable,
                          0, 0, amqp_empty_table);
    check_reply(amqp_get_rpc_reply(conn), "exchange.declare");
  }
  amqp_table_entry_t qarg;
  amqp_table_t qargs = amqp_empty_table;
  if (o->queue_type) {
    if (!o->durable && strcmp(o->queue_type, "classic"))
      die("--queue-type %s needs --durable", o->queue_type);
    qarg.key = amqp_cstring_bytes("x-queue-type");
    qarg.value.kind = AMQP_FIELD_KIND_UTF8;
    qarg.value.value.bytes = amqp_cstring_bytes(o->queue_type);
    qargs.num_entries = 1;
    qargs.entries = &qarg;
  }
  for (int i = 0; i < o->nqueues; i++) {
    amqp_queue_declare(conn, 1, amqp_cstring_bytes(o->queues[i]), 0, o->durable,
                       0, 0, qargs);
    check_reply(amqp_get_rpc_reply(conn), "queue.declare");
    if (o->do_purge) {
      amqp_queue_purge(conn, 1, amqp_cstring_bytes(o->queues[i]));
      check_reply(amqp_get_rpc_reply(conn), "queue.purge");
    }
    if (o->do_bind && have_x) {
      const char *key = o->routing_key ? o->routing_key : o->queues[i];
      amqp_queue_bind(conn, 1, amqp_cstring_bytes(o->queues[i]),
                      amqp_cstring_bytes(o->exchange), amqp_cstring_bytes(key),
                      amqp_empty_table);
      check_reply(amqp_get_rpc_reply(conn), "queue.bind");
    }
  }
  close_broker(conn);
  if (!o->quiet) printf("{\"role\":\"setup\",\"declared\":%d}\n", o->nqueues);
  return 0;
}

/* ------------------------------------------------------------------ */
/* publisher                                                            */

typedef struct {
  const opts_t *o;
  amqp_connection_state_t conn;
  int fd;

  /* raw frame template for one message */
  uint8_t *tmpl;
  size_t tmpl_len;
  size_t body_off; /* offset of the first body byte inside tmpl */
  size_t hdr_end;  /* offset of the first body frame inside tmpl */
  /* --key-template / --header: method and header frames built per message */
  int dynamic;
  kvtab_t hdrs;
  /* output batch buffer */
  uint8_t *buf;
  size_t buf_len, buf_cap;
  /* library-publish */
  uint8_t *body;
  amqp_basic_properties_t props;

  /* confirms */
  uint64_t next_tag; /* delivery tag of the next publish (1-based) */
  uint64_t low_tag;  /* lowest tag that may still be pending */
  uint64_t outstanding;
  uint64_t ring_mask;
  uint64_t *ring_ts; /* send time by tag; 0 = marker (no latency sample) */
  uint8_t *ring_pending;
  uint64_t acked, nacked, returned;
  hist_t confirm_lat;

  uint64_t bad_confirms, writes;
  /* connection.blocked / unblocked from the broker (a resource alarm holds us back) */
  uint64_t blocked_events;
  int blocked;
  char blocked_reason[128];
  int stuck; /* the broker stopped reading: nothing more is sent */
} pub_t;

/* " (...)" for a note about missing confirms: whether the broker has blocked us. */
static const char *pub_blocked_text(const pub_t *p, char *buf, size_t len) {
  if (p->blocked)
    snprintf(buf, len, " (the broker has blocked the connection: %s)", p->blocked_reason);
  else if (p->blocked_events)
    snprintf(buf, len, " (not blocked now; blocked %" PRIu64 " times before)", p->blocked_events);
  else
    snprintf(buf, len, " (no connection.blocked from the broker)");
  return buf;
}

static void build_template(pub_t *p) {
  const opts_t *o = p->o;
  size_t xlen = strlen(o->exchange), klen = strlen(o->routing_key);
  if (xlen > 255 || klen > 255) die("exchange/routing key too long");
  size_t fmax = (size_t)amqp_get_frame_max(p->conn);
  if (fmax == 0) fmax = 131072;
  size_t chunk = fmax - 8; /* frame header 7 + frame end 1 */
  size_t nbody = o->size ? (o->size + chunk - 1) / chunk : 0;
  size_t mpay = 2 + 2 + 2 + 1 + xlen + 1 + klen + 1;
  size_t hpay = 2 + 2 + 8 + 2 + (o->persistent ? 1 : 0);
  p->tmpl_len = (7 + mpay + 1) + (7 + hpay + 1) + nbody * 8 + o->size;
  p->hdr_end = (7 + mpay + 1) + (7 + hpay + 1);
  p->tmpl = calloc(1, p->tmpl_len);
  uint8_t *q = p->tmpl;
  /* method frame: basic.publish */
  *q++ = AMQP_FRAME_METHOD;
  put_u16be(q, 1); q += 2;
  put_u32be(q, (uint32_t)mpay); q += 4;
  put_u16be(q, 60); q += 2;
  put_u16be(q, 40); q += 2;
  put_u16be(q, 0); q += 2; /* ticket */
  *q++ = (uint8_t)xlen; memcpy(q, o->exchange, xlen); q += xlen;
  *q++ = (uint8_t)klen; memcpy(q, o->routing_key, klen); q += klen;
  *q++ = 0; /* mandatory=0 immediate=0 */
  *q++ = AMQP_FRAME_END;
  /* content header */
  *q++ = AMQP_FRAME_HEADER;
  put_u16be(q, 1); q += 2;
  put_u32be(q, (uint32_t)hpay); q += 4;
  put_u16be(q, 60); q += 2;
  put_u16be(q, 0); q += 2; /* weight */
  put_u64be(q, (uint64_t)o->size); q += 8;
  if (o->persistent) {
    put_u16be(q, AMQP_BASIC_DELIVERY_MODE_FLAG); q += 2;
    *q++ = 2;
  } else {
    put_u16be(q, 0); q += 2;
  }
  *q++ = AMQP_FRAME_END;
  /* body frames */
  size_t left = o->size, pos = 0;
  p->body_off = 0;
  for (size_t i = 0; i < nbody; i++) {
    size_t n = left < chunk ? left : chunk;
    *q++ = AMQP_FRAME_BODY;
    put_u16be(q, 1); q += 2;
    put_u32be(q, (uint32_t)n); q += 4;
    if (i == 0) p->body_off = (size_t)(q - p->tmpl);
    for (size_t j = 0; j < n; j++) q[j] = (uint8_t)('a' + (pos + j) % 26);
    q += n;
    pos += n;
    left -= n;
    *q++ = AMQP_FRAME_END;
  }
  if ((size_t)(q - p->tmpl) != p->tmpl_len) die("template size mismatch");

  /* library path */
  p->body = malloc(o->size);
  for (size_t j = 0; j < o->size; j++) p->body[j] = (uint8_t)('a' + j % 26);
  memset(&p->props, 0, sizeof(p->props));
  if (o->persistent) {
    p->props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG;
    p->props.delivery_mode = 2;
  }
}

static void settle(pub_t *p, uint64_t tag, int nack, uint64_t now) {
  uint64_t i = tag & p->ring_mask;
  if (!p->ring_pending[i]) return;
  p->ring_pending[i] = 0;
  p->outstanding--;
  if (!p->ring_ts[i]) return; /* the end marker: not a message */
  if (nack)
    p->nacked++;
  else
    p->acked++;
  hist_add(&p->confirm_lat, now - p->ring_ts[i]);
}

static void on_confirm(pub_t *p, uint64_t tag, int multiple, int nack) {
  uint64_t now = now_ns();
  if (tag >= p->next_tag) {
    if (!p->bad_confirms++)
      note("confirm for unknown delivery tag %" PRIu64 " (next is %" PRIu64 ")",
           tag, p->next_tag);
    return;
  }
  if (multiple) {
    for (uint64_t t = p->low_tag; t <= tag; t++) settle(p, t, nack, now);
  } else if (tag >= p->low_tag) {
    settle(p, tag, nack, now);
  }
  while (p->low_tag < p->next_tag && !p->ring_pending[p->low_tag & p->ring_mask])
    p->low_tag++;
}

/* Skip the content of a basic.return (header + body frames). */
static void skip_content(pub_t *p) {
  amqp_frame_t f;
  struct timeval tv = {10, 0};
  int st = amqp_simple_wait_frame_noblock(p->conn, &f, &tv);
  check_status(st, "read returned header");
  if (f.frame_type != AMQP_FRAME_HEADER) die("expected content header");
  uint64_t left = f.payload.properties.body_size;
  while (left) {
    st = amqp_simple_wait_frame_noblock(p->conn, &f, &tv);
    check_status(st, "read returned body");
    if (f.frame_type != AMQP_FRAME_BODY) die("expected content body");
    left -= f.payload.body_fragment.len;
  }
}

/* Read and process incoming frames. timeout_ns: 0 = only what is available
 * right now, otherwise wait up to that long for the first frame.
 * Returns number of frames handled. */
static int pub_read_frames(pub_t *p, uint64_t timeout_ns) {
  int handled = 0;
  for (;;) {
    amqp_frame_t f;
    struct timeval tv = ns_to_tv(handled ? 0 : timeout_ns);
    int st = amqp_simple_wait_frame_noblock(p->conn, &f, &tv);
    if (st == AMQP_STATUS_TIMEOUT) break;
    check_status(st, "read frame");
    handled++;
    if (f.frame_type != AMQP_FRAME_METHOD) continue;
    switch (f.payload.method.id) {
      case AMQP_BASIC_ACK_METHOD: {
        amqp_basic_ack_t *m = (amqp_basic_ack_t *)f.payload.method.decoded;
        on_confirm(p, m->delivery_tag, m->multiple, 0);
        break;
      }
      case AMQP_BASIC_NACK_METHOD: {
        amqp_basic_nack_t *m = (amqp_basic_nack_t *)f.payload.method.decoded;
        on_confirm(p, m->delivery_tag, m->multiple, 1);
        break;
      }
      case AMQP_BASIC_RETURN_METHOD:
        p->returned++;
        skip_content(p);
        break;
      case AMQP_CONNECTION_BLOCKED_METHOD: {
        amqp_connection_blocked_t *m = (amqp_connection_blocked_t *)f.payload.method.decoded;
        int n = (int)(m->reason.len < sizeof(p->blocked_reason) - 1 ? m->reason.len
                                                                   : sizeof(p->blocked_reason) - 1);
        snprintf(p->blocked_reason, sizeof(p->blocked_reason), "%.*s", n, (char *)m->reason.bytes);
        p->blocked = 1;
        p->blocked_events++;
        note("connection.blocked: %s", p->blocked_reason);
        break;
      }
      case AMQP_CONNECTION_UNBLOCKED_METHOD:
        p->blocked = 0;
        note("connection.unblocked");
        break;
      case AMQP_CHANNEL_CLOSE_METHOD:
      case AMQP_CONNECTION_CLOSE_METHOD:
        fatal_close(p->conn, &f);
        break;
      default:
        note("ignoring method %s", amqp_method_name(f.payload.method.id));
    }
    if (!amqp_frames_enqueued(p->conn)) amqp_maybe_release_buffers(p->conn);
  }
  return handled;
}

/* Wait up to timeout_ns (ns precision; librabbitmq's own timeouts round down
 * to whole milliseconds, which turns sub-ms waits into a busy loop) for
 * incoming frames and process them. */
static int pub_wait_frames(pub_t *p, uint64_t timeout_ns) {
  if (amqp_frames_enqueued(p->conn) || amqp_data_in_buffer(p->conn)) {
    int n = pub_read_frames(p, 0);
    if (n) return n;
  }
  struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
  struct timespec ts = {(time_t)(timeout_ns / 1000000000ull),
                        (long)(timeout_ns % 1000000000ull)};
  int r = ppoll(&pfd, 1, &ts, NULL);
  if (r > 0) return pub_read_frames(p, 0);
  return 0;
}

/* write the whole batch buffer; service confirms while the socket is full. If the
 * broker reads nothing and sends nothing for --confirm-timeout seconds (an alarm or flow
 * control holds the connection), give up: p->stuck is set and the rest is dropped. */
static void pub_flush(pub_t *p) {
  size_t off = 0;
  uint64_t waiting_since = 0;
  while (off < p->buf_len && !p->stuck) {
    ssize_t n = send(p->fd, p->buf + off, p->buf_len - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += (size_t)n;
      p->writes++;
      waiting_since = 0;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waiting_since) waiting_since = now_ns();
      struct pollfd pfd = {.fd = p->fd, .events = POLLOUT | POLLIN};
      int r = poll(&pfd, 1, 1000);
      if (r > 0 && (pfd.revents & POLLIN) && pub_read_frames(p, 0)) waiting_since = now_ns();
      if (r > 0 && (pfd.revents & (POLLERR | POLLHUP)) && !(pfd.revents & POLLOUT))
        die("socket error while publishing");
      if (g_stop) die("interrupted");
      if (now_ns() - waiting_since >= (uint64_t)(p->o->confirm_timeout * 1e9)) {
        char why[200];
        note("the broker read nothing and sent nothing for %.0f s%s", p->o->confirm_timeout,
             pub_blocked_text(p, why, sizeof(why)));
        p->stuck = 1;
      }
      continue;
    }
    die("send: %s", strerror(errno));
  }
  p->buf_len = 0;
}

/* write len bytes at ptr now, bypassing (and after flushing) the batch buffer */
static void pub_write_direct(pub_t *p, const uint8_t *ptr, size_t len) {
  pub_flush(p);
  uint8_t *save = p->buf;
  size_t save_cap = p->buf_cap;
  p->buf = (uint8_t *)ptr;
  p->buf_len = len;
  pub_flush(p);
  p->buf = save;
  p->buf_cap = save_cap;
}

/* --key-template / --header / --message-id: the routing key, headers and message id are rendered from
 * kseq (the message's sequence number; the end marker's is the number of
 * messages sent, so it is routed like one more message). */
static void pub_one_dynamic(pub_t *p, uint64_t seq, uint64_t ts, uint64_t kseq) {
  const opts_t *o = p->o;
  char key[256];
  const char *rk = o->routing_key;
  if (o->nkey_tmpl) {
    render(o->key_tmpl[0], kseq, key, sizeof(key));
    rk = key;
  }
  amqp_basic_properties_t props = p->props;
  if (o->nheaders) {
    kv_render(&p->hdrs, o->headers, o->nheaders, kseq);
    props._flags |= AMQP_BASIC_HEADERS_FLAG;
    props.headers = p->hdrs.t;
  }
  char message_id[256];
  if (o->message_id_tmpl) {
    props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
    props.message_id = (amqp_bytes_t){render(o->message_id_tmpl, kseq, message_id, sizeof(message_id)),
                                      message_id};
  }
  if (o->lib_publish) {
    if (o->size >= 16) {
      put_u64le(p->body, seq);
      put_u64le(p->body + 8, ts);
    }
    amqp_bytes_t b = {o->size, p->body};
    int st = amqp_basic_publish(p->conn, 1, amqp_cstring_bytes(o->exchange),
                                amqp_cstring_bytes(rk), 0, 0, &props, b);
    check_status(st, "basic.publish");
    p->writes++;
    return;
  }
  uint8_t pre[16384];
  amqp_basic_publish_t m;
  memset(&m, 0, sizeof(m));
  m.exchange = amqp_cstring_bytes(o->exchange);
  m.routing_key = amqp_cstring_bytes(rk);
  size_t n = put_method_frame(pre, sizeof(pre), 1, AMQP_BASIC_PUBLISH_METHOD, &m);
  n += put_header_frame(pre + n, sizeof(pre) - n, 1, o->size, &props);
  const uint8_t *body = p->tmpl + p->hdr_end;
  size_t blen = p->tmpl_len - p->hdr_end;
  size_t boff = p->body_off - p->hdr_end; /* seq/ts position inside body */
  if (n + blen <= p->buf_cap) {
    if (p->buf_len + n + blen > p->buf_cap) pub_flush(p);
    uint8_t *dst = p->buf + p->buf_len;
    memcpy(dst, pre, n);
    memcpy(dst + n, body, blen);
    if (o->size >= 16) {
      put_u64le(dst + n + boff, seq);
      put_u64le(dst + n + boff + 8, ts);
    }
    p->buf_len += n + blen;
  } else {
    /* big message: frames straight from the template, no copy */
    pub_write_direct(p, pre, n);
    if (o->size >= 16) {
      put_u64le(p->tmpl + p->body_off, seq);
      put_u64le(p->tmpl + p->body_off + 8, ts);
    }
    pub_write_direct(p, body, blen);
  }
}

static void pub_one(pub_t *p, uint64_t seq, uint64_t ts, uint64_t ring_ts) {
  const opts_t *o = p->o;
  if (o->confirm) {
    uint64_t i = p->next_tag & p->ring_mask;
    p->ring_ts[i] = ring_ts;
    p->ring_pending[i] = 1;
    p->outstanding++;
    p->next_tag++;
  }
  if (p->dynamic) {
    pub_one_dynamic(p, seq, ts, seq == END_MARKER ? ts : seq);
  } else if (o->lib_publish) {
    if (o->size >= 16) {
      put_u64le(p->body, seq);
      put_u64le(p->body + 8, ts);
    }
    amqp_bytes_t b = {o->size, p->body};
    int st = amqp_basic_publish(p->conn, 1, amqp_cstring_bytes(o->exchange),
                                amqp_cstring_bytes(o->routing_key), 0, 0,
                                &p->props, b);
    check_status(st, "basic.publish");
    p->writes++;
  } else {
    uint8_t *dst;
    if (p->tmpl_len > p->buf_cap) {
      /* huge message: patch the template and write it directly */
      pub_flush(p);
      dst = p->tmpl;
    } else {
      if (p->buf_len + p->tmpl_len > p->buf_cap) pub_flush(p);
      dst = p->buf + p->buf_len;
      memcpy(dst, p->tmpl, p->tmpl_len);
    }
    if (o->size >= 16) {
      put_u64le(dst + p->body_off, seq);
      put_u64le(dst + p->body_off + 8, ts);
    }
    if (dst == p->tmpl) {
      uint8_t *save = p->buf;
      size_t save_cap = p->buf_cap;
      p->buf = p->tmpl;
      p->buf_len = p->tmpl_len;
      pub_flush(p);
      p->buf = save;
      p->buf_cap = save_cap;
    } else {
      p->buf_len += p->tmpl_len;
    }
  }
}

static void pub_flush_any(pub_t *p) {
  if (!p->o->lib_publish && p->buf_len) pub_flush(p);
}

/* Block until another message may be published in confirm mode: fewer than
 * --window unconfirmed and room in the tag ring. Returns -1 if no confirm
 * arrived for --confirm-timeout seconds, or on a signal. */
static int pub_wait_window(pub_t *p) {
  const opts_t *o = p->o;
  while (p->outstanding >= (uint64_t)o->window ||
         p->next_tag - p->low_tag > p->ring_mask) {
    pub_flush_any(p);
    if (p->stuck) return -1;
    uint64_t before = p->acked + p->nacked;
    uint64_t t_wait = now_ns();
    while (p->acked + p->nacked == before) {
      if (g_stop) return -1;
      pub_wait_frames(p, 100000000ull);
      if (now_ns() - t_wait >= (uint64_t)(o->confirm_timeout * 1e9)) {
        char why[200];
        note("no confirm received for %.0f s with the window full (%" PRIu64 " unconfirmed)%s",
             o->confirm_timeout, p->outstanding, pub_blocked_text(p, why, sizeof(why)));
        return -1;
      }
    }
  }
  return 0;
}

static int cmd_publish(opts_t *o) {
  g_role = "loadgen publish";
  if (!o->routing_key) o->routing_key = o->queue ? o->queue : "";
  if (!o->count && !o->seconds) die("need --count and/or --seconds");
  if (o->size < 16) note("--size < 16: no sequence/timestamp in body");
  if (o->window < 1) o->window = 1;
  if (o->batch_bytes < 4096) o->batch_bytes = 4096;
  if (o->nkey_tmpl > 1) die("publish takes one --key-template");

  pub_t P;
  memset(&P, 0, sizeof(P));
  pub_t *p = &P;
  p->o = o;
  p->dynamic = o->nkey_tmpl || o->nheaders || o->message_id_tmpl;
  p->conn = connect_broker_as(o, &p->fd, 1);
  if (o->sndbuf > 0) {
    /* keep the amount of data parked in socket buffers small, otherwise a
     * slow broker gets credited with publishes it has not read yet */
    setsockopt(p->fd, SOL_SOCKET, SO_SNDBUF, &o->sndbuf, sizeof(o->sndbuf));
  }
  build_template(p);
  p->buf_cap = o->batch_bytes;
  p->buf = malloc(p->buf_cap);
  hist_init(&p->confirm_lat);
  if (o->confirm) {
    amqp_confirm_select(p->conn, 1);
    check_reply(amqp_get_rpc_reply(p->conn), "confirm.select");
    uint64_t rs = 1;
    while (rs < (uint64_t)o->window * 4) rs <<= 1;
    p->ring_mask = rs - 1;
    p->ring_ts = calloc(rs, sizeof(uint64_t));
    p->ring_pending = calloc(rs, 1);
    p->next_tag = p->low_tag = 1;
  }
  /* how many messages between checks of the clock / inbound confirms */
  uint64_t per_batch = o->batch_bytes / p->tmpl_len;
  if (per_batch < 1) per_batch = 1;

  uint64_t t0 = now_ns();
  uint64_t deadline = o->seconds ? t0 + (uint64_t)(o->seconds * 1e9) : UINT64_MAX;
  double interval = o->rate > 0 ? 1e9 / o->rate : 0;
  uint64_t seq = 0;
  int stopped_by_signal = 0, stalled = 0;
  uint64_t now = t0;

  while ((!o->count || seq < o->count)) {
    if (g_stop) {
      stopped_by_signal = 1;
      break;
    }
    if (p->stuck) {
      stalled = 1;
      break;
    }
    if (interval > 0) {
      uint64_t due = t0 + (uint64_t)(interval * (double)seq);
      now = now_ns();
      if (now >= deadline) break;
      if (now < due) {
        pub_flush_any(p);
        if (due > deadline) due = deadline;
        if (o->confirm) {
          /* wait for confirms until the next send is due */
          while ((now = now_ns()) < due && !g_stop) pub_wait_frames(p, due - now);
        } else {
          struct timespec ts = {(time_t)(due / 1000000000ull),
                                (long)(due % 1000000000ull)};
          while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
            if (g_stop) break;
        }
        continue; /* re-check deadline/stop */
      }
    } else if (seq % per_batch == 0) {
      now = now_ns();
      if (now >= deadline) break;
    }
    if (o->confirm) {
      if (pub_wait_window(p) < 0) {
        if (!g_stop) stalled = 1;
        break;
      }
    }
    uint64_t ts = now_ns();
    pub_one(p, seq, ts, ts);
    seq++;
    if (interval > 0) {
      /* latency mode: send immediately */
      pub_flush_any(p);
    } else if (o->confirm && !o->lib_publish && p->buf_len == 0) {
      /* a batch just went out: pick up confirms that are already here */
      pub_read_frames(p, 0);
    } else if (o->confirm && o->lib_publish && seq % per_batch == 0) {
      pub_read_frames(p, 0);
    }
  }
  uint64_t sent = seq;
  if (!o->no_marker && !stalled) {
    if (!o->confirm || pub_wait_window(p) == 0) pub_one(p, END_MARKER, sent, 0);
  }
  pub_flush_any(p);
  uint64_t t_sent = now_ns();
  int confirm_timed_out = stalled;
  if (o->confirm && !stalled) {
    uint64_t limit = now_ns() + (uint64_t)(o->confirm_timeout * 1e9);
    while (p->outstanding > 0) {
      if (now_ns() >= limit) {
        confirm_timed_out = 1;
        char why[200];
        note("timed out waiting for %" PRIu64 " confirms%s", p->outstanding,
             pub_blocked_text(p, why, sizeof(why)));
        break;
      }
      pub_wait_frames(p, 100000000ull);
    }
  }
  /* Barrier: channel.close-ok is sent by the broker only after it has
   * processed every publish that precedes it on the channel, so "elapsed"
   * covers messages the broker has actually taken in, not bytes that are
   * still sitting in socket buffers. In confirm mode the last confirm is
   * already such a barrier. */
  int drain_timed_out = 0;
  uint64_t t_end = now_ns();
  if (p->stuck) {
    /* librabbitmq's sends wait without a bound: a close would hang on the full socket */
    drain_timed_out = 1;
  } else {
    struct timeval tv = ns_to_tv((uint64_t)(o->confirm_timeout * 1e9));
    if (stalled || stopped_by_signal || confirm_timed_out) tv.tv_sec = 2, tv.tv_usec = 0;
    amqp_set_rpc_timeout(p->conn, &tv);
    amqp_rpc_reply_t r = amqp_channel_close(p->conn, 1, AMQP_REPLY_SUCCESS);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      drain_timed_out = 1;
      note("channel.close did not complete");
    }
    if (!o->confirm) t_end = now_ns();
  }
  double elapsed = (double)(t_end - t0) / 1e9;
  double send_elapsed = (double)(t_sent - t0) / 1e9;
  {
    struct timeval tv = {5, 0};
    amqp_set_rpc_timeout(p->conn, &tv);
    if (!p->stuck && !drain_timed_out) amqp_connection_close(p->conn, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(p->conn);
  }

  printf("{\"role\":\"publish\",\"exchange\":\"%s\",\"routing_key\":\"%s\","
         "\"size\":%zu,\"confirm\":%s,\"persistent\":%s,\"sent\":%" PRIu64
         ",\"elapsed_s\":%.4f,\"send_elapsed_s\":%.4f,\"rate\":%.1f,"
         "\"target_rate\":%.1f,\"writes\":%" PRIu64 ",\"t_start_ns\":%" PRIu64,
         o->exchange, o->nkey_tmpl ? o->key_tmpl[0] : o->routing_key, o->size, o->confirm ? "true" : "false",
         o->persistent ? "true" : "false", sent, elapsed, send_elapsed,
         elapsed > 0 ? (double)sent / elapsed : 0.0, o->rate, p->writes, t0);
  if (o->confirm) {
    printf(",\"window\":%d,\"acked\":%" PRIu64 ",\"nacked\":%" PRIu64
           ",\"unconfirmed\":%" PRIu64 ",\"bad_confirms\":%" PRIu64
           ",\"confirm_timed_out\":%s,",
           o->window, p->acked, p->nacked, sent - p->acked - p->nacked, p->bad_confirms,
           confirm_timed_out ? "true" : "false");
    hist_json(stdout, "confirm_latency", &p->confirm_lat);
  }
  printf(",\"returned\":%" PRIu64 ",\"blocked\":%" PRIu64 ",\"blocked_at_end\":%s"
         ",\"send_stuck\":%s,\"drain_timed_out\":%s,\"interrupted\":%s}\n",
         p->returned, p->blocked_events, p->blocked ? "true" : "false", p->stuck ? "true" : "false",
         drain_timed_out ? "true" : "false", stopped_by_signal ? "true" : "false");
  fflush(stdout);
  return (confirm_timed_out || stopped_by_signal) ? 3 : 0;
}

/* ------------------------------------------------------------------ */
/* consumer                                                             */

typedef struct {
  const opts_t *o;
  amqp_connection_state_t conn;
  uint8_t *seen; /* bitmap of sequence numbers */
  uint64_t seen_bits;
  uint64_t received, unique, dups, redelivered, out_of_order, bytes;
  uint64_t short_bodies, bad_seq;
  uint64_t max_seq_plus1;
  int marker_seen;
  uint64_t expected;
  uint64_t t_first, t_last;
  hist_t lat;
  /* acking */
  uint64_t last_tag, unacked;
  uint64_t acks_sent;
  /* streams: --expect-from, --check-offsets */
  uint64_t unexpected;      /* messages below --expect-from */
  uint64_t first_seq;       /* of the first message (not the marker); UINT64_MAX: none */
  int d_has_offset;         /* the current delivery's x-stream-offset header */
  int64_t d_offset;
  uint64_t offset_errors;   /* header differs from the sequence number */
  uint64_t no_offset;       /* header missing (or not an integer) */
} cons_t;

/* The x-stream-offset header of a delivery: 1 and *out, or 0 if it has none
 * (or one that is not an integer). RabbitMQ and Warren send a long ('l'). */
static int stream_offset_of(const amqp_basic_properties_t *p, int64_t *out) {
  if (!p || !(p->_flags & AMQP_BASIC_HEADERS_FLAG)) return 0;
  for (int i = 0; i < p->headers.num_entries; i++) {
    const amqp_table_entry_t *e = &p->headers.entries[i];
    if (e->key.len != 15 || memcmp(e->key.bytes, "x-stream-offset", 15)) continue;
    const amqp_field_value_t *v = &e->value;
    switch (v->kind) {
      case AMQP_FIELD_KIND_I8: *out = v->value.i8; return 1;
      case AMQP_FIELD_KIND_U8: *out = v->value.u8; return 1;
      case AMQP_FIELD_KIND_I16: *out = v->value.i16; return 1;
      case AMQP_FIELD_KIND_U16: *out = v->value.u16; return 1;
      case AMQP_FIELD_KIND_I32: *out = v->value.i32; return 1;
      case AMQP_FIELD_KIND_U32: *out = v->value.u32; return 1;
      case AMQP_FIELD_KIND_I64: *out = v->value.i64; return 1;
      case AMQP_FIELD_KIND_U64: *out = (int64_t)v->value.u64; return 1;
      default: return 0;
    }
  }
  return 0;
}

/* messages this consumer should receive, once the end marker said how many
 * were published: expected - --expect-from */
static uint64_t cons_want(const cons_t *c) {
  return c->expected > c->o->expect_from ? c->expected - c->o->expect_from : 0;
}

static void cons_ack(cons_t *c) {
  if (c->o->ack_every && c->unacked) {
    int st = amqp_basic_ack(c->conn, 1, c->last_tag, c->unacked > 1);
    check_status(st, "basic.ack");
    c->unacked = 0;
    c->acks_sent++;
  }
}

static void cons_message(cons_t *c, uint64_t tag, int redelivered,
                         const uint8_t *head, size_t head_len, uint64_t size) {
  uint64_t now = now_ns();
  c->received++;
  c->bytes += size;
  if (redelivered) c->redelivered++;
  if (!c->t_first) c->t_first = now;
  c->last_tag = tag;
  c->unacked++;
  if (c->o->ack_every && c->unacked >= (uint64_t)c->o->ack_every) cons_ack(c);
  if (head_len < 16) {
    c->short_bodies++;
    c->t_last = now;
    return;
  }
  uint64_t seq = get_u64le(head), ts = get_u64le(head + 8);
  if (c->o->check_offsets) {
    /* in a stream one publisher filled from empty, message seq is at offset
     * seq and the end marker at offset N (= its count) */
    if (!c->d_has_offset)
      c->no_offset++;
    else if ((uint64_t)c->d_offset != (seq == END_MARKER ? ts : seq))
      c->offset_errors++;
  }
  if (seq == END_MARKER) {
    c->received--; /* the marker does not count as a message */
    c->bytes -= size;
    if (redelivered) c->redelivered--;
    c->marker_seen = 1;
    c->expected = ts;
    return;
  }
  c->t_last = now;
  if (seq > ((uint64_t)1 << 40)) {
    c->bad_seq++;
    return;
  }
  if (c->first_seq == UINT64_MAX) c->first_seq = seq;
  if (seq < c->o->expect_from) {
    c->unexpected++;
    return;
  }
  if (seq >= c->seen_bits) {
    uint64_t nb = c->seen_bits ? c->seen_bits : (1u << 20);
    while (nb <= seq) nb <<= 1;
    c->seen = realloc(c->seen, nb / 8);
    if (!c->seen) die("out of memory");
    memset(c->seen + c->seen_bits / 8, 0, (nb - c->seen_bits) / 8);
    c->seen_bits = nb;
  }
  uint8_t bit = (uint8_t)(1u << (seq & 7));
  if (c->seen[seq >> 3] & bit) {
    c->dups++;
    return;
  }
  c->seen[seq >> 3] |= bit;
  c->unique++;
  if (seq + 1 < c->max_seq_plus1)
    c->out_of_order++;
  else
    c->max_seq_plus1 = seq + 1;
  if (now >= ts) hist_add(&c->lat, now - ts);
}

static int cons_done(cons_t *c) {
  if (c->marker_seen && c->unique >= cons_want(c)) return 1;
  if (c->o->count && c->unique >= c->o->count) return 1;
  return 0;
}

static int cmd_consume(opts_t *o) {
  g_role = "loadgen consume";
  if (!o->queue) die("need --queue");
  if (o->prefetch && o->ack_every > o->prefetch) {
    note("--ack-every %d > --prefetch %d would stall; using %d", o->ack_every,
          o->prefetch, o->prefetch);
    o->ack_every = o->prefetch;
  }
  cons_t C;
  memset(&C, 0, sizeof(C));
  cons_t *c = &C;
  c->o = o;
  c->first_seq = UINT64_MAX;
  hist_init(&c->lat);
  /* --stream-offset: an integer is a signed 64-bit long ('l'), anything else
   * (first, last, next, 10m, ...) a long string */
  amqp_table_entry_t carg;
  amqp_table_t cargs = amqp_empty_table;
  if (o->stream_offset) {
    const char *so = o->stream_offset;
    char *end;
    errno = 0;
    long long v = strtoll(so, &end, 10);
    carg.key = amqp_cstring_bytes("x-stream-offset");
    if (*so && !*end && !errno && (isdigit((unsigned char)so[0]) || so[0] == '-')) {
      carg.value.kind = AMQP_FIELD_KIND_I64;
      carg.value.value.i64 = (int64_t)v;
    } else {
      carg.value.kind = AMQP_FIELD_KIND_UTF8;
      carg.value.value.bytes = amqp_cstring_bytes(so);
    }
    cargs.num_entries = 1;
    cargs.entries = &carg;
  }
  c->conn = connect_broker(o, NULL);
  if (o->prefetch) {
    amqp_basic_qos(c->conn, 1, 0, (uint16_t)o->prefetch, 0);
    check_reply(amqp_get_rpc_reply(c->conn), "basic.qos");
  }
  amqp_basic_consume(c->conn, 1, amqp_cstring_bytes(o->queue), amqp_empty_bytes,
                     0, o->ack_every == 0, 0, cargs);
  check_reply(amqp_get_rpc_reply(c->conn), "basic.consume");
  if (o->ready_file) {
    FILE *f = fopen(o->ready_file, "w");
    if (f) fclose(f);
  }

  uint64_t t0 = now_ns();
  uint64_t deadline = o->seconds ? t0 + (uint64_t)(o->seconds * 1e9) : UINT64_MAX;
  uint64_t idle_ns = (uint64_t)(o->idle_timeout * 1e9);
  uint64_t grace_ns = (uint64_t)(o->grace * 1e9);
  uint64_t last_activity = t0;
  const char *stop_reason = "complete";

  /* deliver state machine for the frame-level reader */
  enum { S_METHOD, S_HEADER, S_BODY } st = S_METHOD;
  uint64_t d_tag = 0, d_size = 0, d_got = 0;
  int d_redeliv = 0;
  uint8_t head[16];
  size_t head_len = 0;
  uint64_t frames = 0;

  while (!cons_done(c)) {
    if (g_stop) {
      stop_reason = "signal";
      break;
    }
    uint64_t now = now_ns();
    if (now >= deadline) {
      stop_reason = "deadline";
      break;
    }
    if (c->marker_seen && now - last_activity >= grace_ns) {
      stop_reason = "grace";
      break;
    }
    if (c->received && idle_ns && now - last_activity >= idle_ns) {
      stop_reason = "idle";
      break;
    }
    uint64_t wait = 100000000ull; /* 100 ms */
    if (deadline - now < wait) wait = deadline - now;
    struct timeval tv = ns_to_tv(wait);

    if (o->lib_consume) {
      amqp_envelope_t env;
      amqp_rpc_reply_t r = amqp_consume_message(c->conn, &env, &tv, 0);
      if (r.reply_type == AMQP_RESPONSE_NORMAL) {
        size_t hl = env.message.body.len < 16 ? env.message.body.len : 16;
        c->d_has_offset = stream_offset_of(&env.message.properties, &c->d_offset);
        cons_message(c, env.delivery_tag, env.redelivered,
                     (const uint8_t *)env.message.body.bytes, hl,
                     env.message.body.len);
        amqp_destroy_envelope(&env);
        last_activity = now_ns();
      } else if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
                 r.library_error == AMQP_STATUS_TIMEOUT) {
        cons_ack(c); /* idle: flush pending acks */
      } else if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
                 r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
        amqp_frame_t f;
        int s = amqp_simple_wait_frame(c->conn, &f);
        check_status(s, "read frame");
        if (f.frame_type == AMQP_FRAME_METHOD) fatal_close(c->conn, &f);
      } else {
        check_reply(r, "consume_message");
      }
      amqp_maybe_release_buffers(c->conn);
      continue;
    }

    amqp_frame_t f;
    int s = amqp_simple_wait_frame_noblock(c->conn, &f, &tv);
    if (s == AMQP_STATUS_TIMEOUT) {
      cons_ack(c);
      continue;
    }
    check_status(s, "read frame");
    frames++;
    switch (f.frame_type) {
      case AMQP_FRAME_METHOD:
        if (f.payload.method.id == AMQP_BASIC_DELIVER_METHOD) {
          if (st != S_METHOD) die("basic.deliver in the middle of a message");
          amqp_basic_deliver_t *m = (amqp_basic_deliver_t *)f.payload.method.decoded;
          d_tag = m->delivery_tag;
          d_redeliv = m->redelivered;
          st = S_HEADER;
        } else if (f.payload.method.id == AMQP_BASIC_CANCEL_METHOD) {
          stop_reason = "cancelled";
          goto out;
        } else {
          fatal_close(c->conn, &f);
          note("ignoring method %s", amqp_method_name(f.payload.method.id));
        }
        break;
      case AMQP_FRAME_HEADER:
        if (st != S_HEADER) die("unexpected content header");
        d_size = f.payload.properties.body_size;
        if (o->check_offsets)
          c->d_has_offset = stream_offset_of(
              (const amqp_basic_properties_t *)f.payload.properties.decoded, &c->d_offset);
        d_got = 0;
        head_len = 0;
        if (d_size == 0) {
          cons_message(c, d_tag, d_redeliv, head, 0, 0);
          last_activity = now_ns();
          st = S_METHOD;
        } else {
          st = S_BODY;
        }
        break;
      case AMQP_FRAME_BODY: {
        if (st != S_BODY) die("unexpected content body");
        size_t n = f.payload.body_fragment.len;
        if (head_len < 16) {
          size_t k = 16 - head_len < n ? 16 - head_len : n;
          memcpy(head + head_len, f.payload.body_fragment.bytes, k);
          head_len += k;
        }
        d_got += n;
        if (d_got >= d_size) {
          if (d_got > d_size) die("body longer than announced");
          cons_message(c, d_tag, d_redeliv, head, head_len, d_size);
          last_activity = now_ns();
          st = S_METHOD;
        }
        break;
      }
      case AMQP_FRAME_HEARTBEAT:
        break;
      default:
        note("unexpected frame type %d", f.frame_type);
    }
    if ((frames & 63) == 0 && !amqp_frames_enqueued(c->conn))
      amqp_maybe_release_buffers(c->conn);
  }
out:
  cons_ack(c);
  uint64_t t_end = now_ns();
  close_broker(c->conn);

  /* messages expect_from .. N-1 (N from the marker, else the highest seen) */
  uint64_t missing, want;
  if (c->marker_seen)
    want = cons_want(c);
  else
    want = c->max_seq_plus1 > o->expect_from ? c->max_seq_plus1 - o->expect_from : 0;
  missing = want > c->unique ? want - c->unique : 0;
  double span = c->t_last > c->t_first ? (double)(c->t_last - c->t_first) / 1e9 : 0;
  printf("{\"role\":\"consume\",\"queue\":\"%s\",\"prefetch\":%d,\"ack_every\":%d,"
         "\"received\":%" PRIu64 ",\"unique\":%" PRIu64 ",\"duplicates\":%" PRIu64
         ",\"missing\":%" PRIu64 ",\"marker_seen\":%s,\"expected\":%" PRIu64
         ",\"redelivered\":%" PRIu64 ",\"out_of_order\":%" PRIu64
         ",\"short_bodies\":%" PRIu64 ",\"bad_seq\":%" PRIu64 ",\"bytes\":%" PRIu64
         ",\"acks_sent\":%" PRIu64 ",\"span_s\":%.4f,\"elapsed_s\":%.4f,"
         "\"rate\":%.1f,\"stop_reason\":\"%s\",",
         o->queue, o->prefetch, o->ack_every, c->received, c->unique, c->dups,
         missing, c->marker_seen ? "true" : "false",
         c->marker_seen ? c->expected : c->max_seq_plus1, c->redelivered,
         c->out_of_order, c->short_bodies, c->bad_seq, c->bytes, c->acks_sent,
         span, (double)(t_end - t0) / 1e9,
         span > 0 ? (double)c->received / span : 0.0, stop_reason);
  printf("\"expect_from\":%" PRIu64 ",\"unexpected\":%" PRIu64 ",\"first_seq\":",
         o->expect_from, c->unexpected);
  if (c->first_seq == UINT64_MAX)
    printf("null,");
  else
    printf("%" PRIu64 ",", c->first_seq);
  if (o->stream_offset) printf("\"stream_offset\":\"%s\",", o->stream_offset);
  if (o->check_offsets)
    printf("\"offset_errors\":%" PRIu64 ",\"no_offset\":%" PRIu64 ",", c->offset_errors,
           c->no_offset);
  /* t_end_ns: the last ack sent (the clock is CLOCK_MONOTONIC, a publisher's t_start_ns on the
   * same machine compares with it) */
  printf("\"t_first_ns\":%" PRIu64 ",\"t_last_ns\":%" PRIu64 ",\"t_end_ns\":%" PRIu64 ",",
         c->t_first, c->t_last, t_end);
  hist_json(stdout, "latency", &c->lat);
  printf("}\n");
  fflush(stdout);
  return 0;
}

/* ------------------------------------------------------------------ */
/* count: passive declare, optionally waiting for a message count        */

/* Like connect_broker(), but returns NULL (with a reason) instead of dying:
 * the broker may still be starting. */
static amqp_connection_state_t try_connect(const opts_t *o, char *why, size_t whylen) {
  amqp_connection_state_t conn = amqp_new_connection();
  if (!conn) die("amqp_new_connection failed");
  amqp_socket_t *sock = amqp_tcp_socket_new(conn);
  if (!sock) die("amqp_tcp_socket_new failed");
  struct timeval tv = ns_to_tv((uint64_t)(o->connect_timeout * 1e9));
  int st = amqp_socket_open_noblock(sock, o->host, o->port, &tv);
  if (st != AMQP_STATUS_OK) {
    snprintf(why, whylen, "connect: %s", amqp_error_string2(st));
    amqp_destroy_connection(conn);
    return NULL;
  }
  amqp_set_handshake_timeout(conn, &tv);
  struct timeval rpc_tv = {60, 0};
  amqp_set_rpc_timeout(conn, &rpc_tv);
  amqp_rpc_reply_t r = amqp_login(conn, o->vhost, 0, o->frame_max, 0,
                                  AMQP_SASL_METHOD_PLAIN, o->user, o->pass);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    snprintf(why, whylen, "login failed (reply type %d)", (int)r.reply_type);
    amqp_destroy_connection(conn);
    return NULL;
  }
  return conn;
}

static int cmd_count(opts_t *o) {
  g_role = "loadgen count";
  if (!o->queue) die("need --queue");
  uint64_t t0 = now_ns();
  uint64_t deadline = o->seconds ? t0 + (uint64_t)(o->seconds * 1e9) : 0;
  uint64_t t_connect = 0, t_declared = 0, t_done = 0;
  uint64_t connects = 0, polls = 0, not_found = 0;
  int64_t count = -1, consumers = -1;
  int reached = 0;
  char why[256] = "";
  amqp_connection_state_t conn = NULL;
  amqp_channel_t ch = 0;
  for (;;) {
    if (g_stop) break;
    if (!conn) {
      conn = try_connect(o, why, sizeof(why));
      if (conn) {
        connects++;
        if (!t_connect) t_connect = now_ns();
        ch = 0;
      }
    }
    if (conn && !ch) {
      ch = 1;
      amqp_channel_open(conn, ch);
      if (amqp_get_rpc_reply(conn).reply_type != AMQP_RESPONSE_NORMAL) {
        snprintf(why, sizeof(why), "channel.open failed");
        amqp_destroy_connection(conn);
        conn = NULL;
      }
    }
    if (conn && ch) {
      polls++;
      amqp_queue_declare_ok_t *ok = amqp_queue_declare(
          conn, ch, amqp_cstring_bytes(o->queue), 1 /* passive */, 0, 0, 0,
          amqp_empty_table);
      amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
      if (r.reply_type == AMQP_RESPONSE_NORMAL && ok) {
        count = ok->message_count;
        consumers = ok->consumer_count;
        if (!t_declared) t_declared = now_ns();
        if (!o->count || (uint64_t)count >= o->count) {
          t_done = now_ns();
          reached = 1;
        }
      } else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
                 r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        amqp_channel_close_t *m = (amqp_channel_close_t *)r.reply.decoded;
        snprintf(why, sizeof(why), "queue.declare: %u %.*s", m->reply_code,
                 (int)m->reply_text.len, (char *)m->reply_text.bytes);
        if (m->reply_code == 404) not_found++;
        amqp_channel_close_ok_t cok;
        amqp_send_method(conn, ch, AMQP_CHANNEL_CLOSE_OK_METHOD, &cok);
        ch = 0; /* reopen channel 1 next time */
      } else {
        snprintf(why, sizeof(why), "queue.declare failed (reply type %d)",
                 (int)r.reply_type);
        amqp_destroy_connection(conn);
        conn = NULL;
      }
      if (conn) amqp_maybe_release_buffers(conn);
    }
    if (reached || !deadline || now_ns() >= deadline) break;
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (conn) close_broker(conn);
  printf("{\"role\":\"count\",\"queue\":\"%s\",\"message_count\":%" PRId64
         ",\"consumer_count\":%" PRId64 ",\"expected\":%" PRIu64
         ",\"reached\":%s,\"t_start_ns\":%" PRIu64 ",\"t_connect_ns\":%" PRIu64
         ",\"t_declared_ns\":%" PRIu64 ",\"t_done_ns\":%" PRIu64
         ",\"connects\":%" PRIu64 ",\"polls\":%" PRIu64 ",\"not_found\":%" PRIu64 "}\n",
         o->queue, count, consumers, o->count, reached ? "true" : "false", t0,
         t_connect, t_declared, t_done, connects, polls, not_found);
  fflush(stdout);
  if (!reached && why[0]) note("last problem: %s", why);
  return reached ? 0 : 1;
}

/* ------------------------------------------------------------------ */
/* bulk: many queue.declare / bind / unbind / delete, pipelined, timed   */

/* Requests are encoded into a batch buffer and written with one send() per
 * ~64 KiB, with up to --window of them waiting for their reply, so a fast
 * broker is measured rather than the client's round trips. Replies on one
 * channel come back in order; each phase ends with the last reply. */
typedef struct {
  const opts_t *o;
  amqp_connection_state_t conn;
  int fd;
  uint8_t *buf;
  size_t buf_len, buf_cap;
  uint64_t sent, replied, writes;
  amqp_method_number_t reply_id;
} bulk_t;

static void bulk_read(bulk_t *b) {
  for (;;) {
    amqp_frame_t f;
    struct timeval tv = {0, 0};
    int st = amqp_simple_wait_frame_noblock(b->conn, &f, &tv);
    if (st == AMQP_STATUS_TIMEOUT) break;
    check_status(st, "read frame");
    if (f.frame_type == AMQP_FRAME_METHOD) {
      if (f.payload.method.id == b->reply_id) {
        b->replied++;
      } else {
        fatal_close(b->conn, &f);
        note("ignoring method %s", amqp_method_name(f.payload.method.id));
      }
    }
    if (!amqp_frames_enqueued(b->conn)) amqp_maybe_release_buffers(b->conn);
  }
}

static void bulk_wait(bulk_t *b, uint64_t timeout_ns) {
  if (amqp_frames_enqueued(b->conn) || amqp_data_in_buffer(b->conn)) {
    uint64_t before = b->replied;
    bulk_read(b);
    if (b->replied != before) return;
  }
  struct pollfd pfd = {.fd = b->fd, .events = POLLIN};
  struct timespec ts = {(time_t)(timeout_ns / 1000000000ull),
                        (long)(timeout_ns % 1000000000ull)};
  if (ppoll(&pfd, 1, &ts, NULL) > 0) bulk_read(b);
}

/* returns 0, or -1 at the deadline or on a signal */
static int bulk_flush(bulk_t *b, uint64_t deadline) {
  size_t off = 0;
  while (off < b->buf_len) {
    ssize_t n = send(b->fd, b->buf + off, b->buf_len - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += (size_t)n;
      b->writes++;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      /* the broker may be blocked writing replies: keep reading them */
      struct pollfd pfd = {.fd = b->fd, .events = POLLOUT | POLLIN};
      int r = poll(&pfd, 1, 100);
      if (r > 0 && (pfd.revents & POLLIN)) bulk_read(b);
      if (r > 0 && (pfd.revents & (POLLERR | POLLHUP)) && !(pfd.revents & POLLOUT))
        die("socket error while sending");
      if (g_stop || now_ns() >= deadline) return -1;
      continue;
    }
    die("send: %s", strerror(errno));
  }
  b->buf_len = 0;
  return 0;
}

enum { OP_DECLARE, OP_BIND, OP_UNBIND, OP_DELETE };

static void bulk_encode(bulk_t *b, int op, uint64_t i) {
  const opts_t *o = b->o;
  char qname[256], key[256];
  kvtab_t args;
  amqp_bytes_t q;
  if (o->queue_tmpl)
    q = (amqp_bytes_t){render(o->queue_tmpl, i, qname, sizeof(qname)), qname};
  else
    q = amqp_cstring_bytes(o->queue);
  amqp_bytes_t k = q;
  if ((op == OP_BIND || op == OP_UNBIND) && o->nkey_tmpl) {
    int nt = o->nkey_tmpl;
    k = (amqp_bytes_t){render(o->key_tmpl[i % (uint64_t)nt], i / (uint64_t)nt, key,
                              sizeof(key)), key};
  }
  amqp_table_t targs = amqp_empty_table;
  if (o->nbind_args) {
    kv_render(&args, o->bind_args, o->nbind_args, i);
    targs = args.t;
  }
  uint8_t *dst = b->buf + b->buf_len;
  size_t cap = b->buf_cap - b->buf_len;
  switch (op) {
    case OP_DECLARE: {
      amqp_queue_declare_t m = {.queue = q, .durable = (amqp_boolean_t)o->durable,
                                .arguments = amqp_empty_table};
      b->buf_len += put_method_frame(dst, cap, 1, AMQP_QUEUE_DECLARE_METHOD, &m);
      break;
    }
    case OP_BIND: {
      amqp_queue_bind_t m = {.queue = q, .exchange = amqp_cstring_bytes(o->exchange),
                             .routing_key = k, .arguments = targs};
      b->buf_len += put_method_frame(dst, cap, 1, AMQP_QUEUE_BIND_METHOD, &m);
      break;
    }
    case OP_UNBIND: {
      amqp_queue_unbind_t m = {.queue = q, .exchange = amqp_cstring_bytes(o->exchange),
                               .routing_key = k, .arguments = targs};
      b->buf_len += put_method_frame(dst, cap, 1, AMQP_QUEUE_UNBIND_METHOD, &m);
      break;
    }
    default: {
      amqp_queue_delete_t m = {.queue = q};
      b->buf_len += put_method_frame(dst, cap, 1, AMQP_QUEUE_DELETE_METHOD, &m);
    }
  }
  b->sent++;
}

static int cmd_bulk(opts_t *o) {
  g_role = "loadgen bulk";
  static const char *names[] = {"declare", "bind", "unbind", "delete"};
  static const amqp_method_number_t replies[] = {
      AMQP_QUEUE_DECLARE_OK_METHOD, AMQP_QUEUE_BIND_OK_METHOD,
      AMQP_QUEUE_UNBIND_OK_METHOD, AMQP_QUEUE_DELETE_OK_METHOD};
  int ops[16], nops = 0;
  if (!o->ops) die("need --ops");
  if (!o->queue_tmpl && !o->queue) die("need --queue-template or --queue");
  if (!o->count) die("need --count");
  {
    char tmp[256];
    snprintf(tmp, sizeof(tmp), "%s", o->ops);
    for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
      int op = -1;
      for (int j = 0; j < 4; j++)
        if (!strcmp(t, names[j])) op = j;
      if (op < 0 || nops >= 16) die("bad --ops: %s", o->ops);
      if ((op == OP_BIND || op == OP_UNBIND) && !o->exchange[0]) die("%s needs --exchange", t);
      ops[nops++] = op;
    }
  }
  uint64_t window = o->window < 1 ? 1 : (uint64_t)o->window;
  bulk_t B;
  memset(&B, 0, sizeof(B));
  bulk_t *b = &B;
  b->o = o;
  b->conn = connect_broker(o, &b->fd);
  b->buf_cap = o->batch_bytes < 65536 ? 65536 : o->batch_bytes;
  b->buf = malloc(b->buf_cap);
  uint64_t t_start = now_ns();
  uint64_t deadline = o->seconds ? t_start + (uint64_t)(o->seconds * 1e9) : UINT64_MAX;
  double elapsed[16] = {0};
  uint64_t done[16] = {0};
  int timed_out = 0, ph;
  for (ph = 0; ph < nops && !timed_out; ph++) {
    b->sent = b->replied = 0;
    b->reply_id = replies[ops[ph]];
    uint64_t t0 = now_ns();
    for (uint64_t i = o->start; i < o->start + o->count && !timed_out; i++) {
      while (b->sent - b->replied >= window) {
        if (bulk_flush(b, deadline) < 0) break;
        bulk_wait(b, 100000000ull);
        if (g_stop || now_ns() >= deadline) break;
      }
      if (g_stop || now_ns() >= deadline) {
        timed_out = 1;
        break;
      }
      if (b->buf_cap - b->buf_len < 4096 && bulk_flush(b, deadline) < 0) {
        timed_out = 1;
        break;
      }
      bulk_encode(b, ops[ph], i);
      if (b->buf_len >= b->buf_cap - 4096) {
        if (bulk_flush(b, deadline) < 0) timed_out = 1;
        bulk_read(b);
      }
    }
    if (!timed_out && bulk_flush(b, deadline) < 0) timed_out = 1;
    while (!timed_out && b->replied < b->sent) {
      bulk_wait(b, 100000000ull);
      if (g_stop || now_ns() >= deadline) timed_out = b->replied < b->sent;
    }
    elapsed[ph] = (double)(now_ns() - t0) / 1e9;
    done[ph] = b->replied;
  }
  if (timed_out)
    amqp_destroy_connection(b->conn); /* the broker may be stuck: do not wait */
  else
    close_broker(b->conn);
  printf("{\"role\":\"bulk\",\"count\":%" PRIu64 ",\"window\":%" PRIu64
         ",\"durable\":%s,\"writes\":%" PRIu64 ",\"timed_out\":%s,\"phases\":[",
         o->count, window, o->durable ? "true" : "false", b->writes,
         timed_out ? "true" : "false");
  for (int j = 0; j < ph; j++)
    printf("%s{\"op\":\"%s\",\"done\":%" PRIu64 ",\"elapsed_s\":%.4f,\"timed_out\":%s}",
           j ? "," : "", names[ops[j]], done[j], elapsed[j],
           timed_out && j == ph - 1 ? "true" : "false");
  printf("]}\n");
  fflush(stdout);
  return timed_out ? 4 : 0;
}

/* ------------------------------------------------------------------ */

int main(int argc, char **argv) {
  if (argc < 2) usage();
  const char *mode = argv[1];
  opts_t o;
  parse_opts(&o, argc - 1, argv + 1);
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  if (!strcmp(mode, "publish")) return cmd_publish(&o);
  if (!strcmp(mode, "consume")) return cmd_consume(&o);
  if (!strcmp(mode, "setup")) return cmd_setup(&o);
  if (!strcmp(mode, "count")) return cmd_count(&o);
  if (!strcmp(mode, "bulk")) return cmd_bulk(&o);
  usage();
  return 1;
}
