/* The native reader of NCCL COLL call lines: opbench.trace.parse's LINE grammar, the tally of analyze._Tally and
 * the Send/Recv grouping of p2p.P2pGrouper, one line at a time in C (docs/trace.md, "Native reader").
 *
 * Why: a Python process cannot read a call line in less time than a per-line regex loop spends finding it
 * (docs/trace.md, "Speed and memory"); here a call line costs no Python object. The Python code stays the
 * definition: a line this reader cannot read exactly as LINE would is handed back (Engine.scan returns its
 * offset) and read by the Python code, whose LineKeys and CallRecords come back through feed_keys/feed_record
 * into the same grouping state. Field values are parsed by Python callbacks, once per distinct who token and
 * per distinct "datatype … [nranks=N]" span (cached here, at most CACHE_LIMIT of each).
 *
 * Memory: at most 96 bytes per stream (process + communicator) met, the open groups and their lines, the
 * distinct tally keys and the bounded caches; a group's buffers go back when it ends (docs/trace.md).
 *
 * Robustness: every method refuses an engine that __init__ did not set up, and a call made from inside one of
 * the engine's own callbacks (the busy flag): a callback that calls back in would change the tables under the
 * caller. No pointer into a table is held across a callback.
 *
 * Built as an optional extension (setup.py): without a C compiler opbench uses the Python reader, with the
 * same results (tests/test_trace_native.py compares the two).
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE /* memmem, memrchr */
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define OUT_OF_RANGE (-(INT64_C(1) << 62)) /* parse.OUT_OF_RANGE */
#define CACHE_LIMIT (1 << 16)              /* p2p.CACHE_LIMIT */
#define BOUND (INT64_C(1) << 62)           /* nranks and peers beyond ±BOUND are refused (parse.bounded's range) */
#define POOL_MAX 16                        /* ended groups kept for reuse, each holding at most POOL_BYTES */
#define POOL_BYTES (64 << 10)
#ifdef __GNUC__
#define INLINE inline __attribute__((always_inline)) /* the per-line helpers: a call each costs several % */
#else
#define INLINE inline
#endif

typedef struct {
    const char *p;
    Py_ssize_t n;
} Span;

/* ---- hashing and a table of byte-string keys, each with five int64 values -------------------------------- */

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return h;
}

static uint64_t hash_bytes(const char *p, Py_ssize_t n, uint64_t h) {
    h ^= (uint64_t)n * UINT64_C(0x9E3779B97F4A7C15);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * UINT64_C(0xc4ceb9fe1a85ec53);
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, (size_t)n);
    return mix(h ^ w);
}

typedef struct {
    uint64_t hash;
    char *key; /* NULL: empty slot */
    Py_ssize_t len;
    int64_t v[5];
} Slot;

typedef struct {
    Slot *slots; /* NULL: not set up (an engine __init__ did not reach) */
    size_t mask, used;
} Table;

static int table_init(Table *t, size_t cap) {
    t->slots = PyMem_Calloc(cap, sizeof(Slot));
    if (t->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->mask = cap - 1;
    t->used = 0;
    return 0;
}

static void table_free(Table *t) {
    Slot *slots = t->slots;
    if (slots == NULL)
        return;
    t->slots = NULL;
    for (size_t i = 0; i <= t->mask; i++)
        PyMem_Free(slots[i].key);
    PyMem_Free(slots);
}

static void table_clear(Table *t) {
    for (size_t i = 0; i <= t->mask; i++) {
        PyMem_Free(t->slots[i].key);
        t->slots[i].key = NULL;
    }
    t->used = 0;
}

static int table_grow(Table *t) {
    Table bigger;
    if (table_init(&bigger, (t->mask + 1) * 2) < 0)
        return -1;
    for (size_t i = 0; i <= t->mask; i++) {
        Slot *s = &t->slots[i];
        if (s->key == NULL)
            continue;
        size_t j = s->hash & bigger.mask;
        while (bigger.slots[j].key != NULL)
            j = (j + 1) & bigger.mask;
        bigger.slots[j] = *s;
    }
    bigger.used = t->used;
    PyMem_Free(t->slots);
    *t = bigger;
    return 0;
}

/* The slot of key, or NULL when absent. */
static Slot *table_find(const Table *t, const char *key, Py_ssize_t len, uint64_t h) {
    for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
        Slot *s = &t->slots[i];
        if (s->key == NULL)
            return NULL;
        if (s->hash == h && s->len == len && memcmp(s->key, key, (size_t)len) == 0)
            return s;
    }
}

/* The slot of key, created (values zero) when absent; NULL with an exception set on memory failure. *created says
 * which. The pointer is good until the table next changes. */
static Slot *table_get(Table *t, const char *key, Py_ssize_t len, uint64_t h, int *created) {
    size_t i = h & t->mask;
    for (;;) {
        Slot *s = &t->slots[i];
        if (s->key == NULL)
            break;
        if (s->hash == h && s->len == len && memcmp(s->key, key, (size_t)len) == 0) {
            *created = 0;
            return s;
        }
        i = (i + 1) & t->mask;
    }
    if ((t->used + 1) * 2 > t->mask + 1) {
        if (table_grow(t) < 0)
            return NULL;
        return table_get(t, key, len, h, created);
    }
    Slot *s = &t->slots[i];
    s->key = PyMem_Malloc(len > 0 ? (size_t)len : 1);
    if (s->key == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(s->key, key, (size_t)len);
    s->len = len;
    s->hash = h;
    memset(s->v, 0, sizeof s->v);
    t->used++;
    *created = 1;
    return s;
}

/* ---- a set of int64 (the peers of a group) ------------------------------------------------------------ */

#define NO_PEER INT64_MIN /* an empty key: peers are within ±BOUND */

typedef struct {
    int64_t *keys; /* NULL: empty, nothing allocated (most groups' Recv side while they hold one Send) */
    size_t mask, used;
} IntSet;

static void intset_clear(IntSet *s) {
    if (s->keys != NULL)
        for (size_t i = 0; i <= s->mask; i++)
            s->keys[i] = NO_PEER;
    s->used = 0;
}

static int intset_has(const IntSet *s, int64_t k) {
    if (s->keys == NULL)
        return 0;
    size_t i = mix((uint64_t)k) & s->mask;
    while (s->keys[i] != NO_PEER) {
        if (s->keys[i] == k)
            return 1;
        i = (i + 1) & s->mask;
    }
    return 0;
}

/* Add k; intset_reserve made room, so this cannot fail. */
static void intset_insert(IntSet *s, int64_t k) {
    size_t i = mix((uint64_t)k) & s->mask;
    while (s->keys[i] != NO_PEER) {
        if (s->keys[i] == k)
            return;
        i = (i + 1) & s->mask;
    }
    s->keys[i] = k;
    s->used++;
}

/* Room for one more key at most half full: 4 slots at first, doubled when needed. -1 with an exception set. */
static int intset_reserve(IntSet *s) {
    size_t cap = s->keys == NULL ? 0 : s->mask + 1;
    if ((s->used + 1) * 2 <= cap)
        return 0;
    size_t bigger = cap ? cap * 2 : 4;
    int64_t *old = s->keys, *keys = PyMem_Malloc(bigger * sizeof(int64_t));
    if (keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < bigger; i++)
        keys[i] = NO_PEER;
    s->keys = keys;
    s->mask = bigger - 1;
    s->used = 0;
    for (size_t i = 0; i < cap; i++)
        if (old[i] != NO_PEER)
            intset_insert(s, old[i]);
    PyMem_Free(old);
    return 0;
}

static size_t intset_bytes(const IntSet *s) { return s->keys == NULL ? 0 : (s->mask + 1) * sizeof(int64_t); }

static PyObject *intset_to_py(const IntSet *s) {
    PyObject *set = PySet_New(NULL);
    if (set == NULL)
        return NULL;
    for (size_t i = 0; s->keys != NULL && i <= s->mask; i++) {
        if (s->keys[i] == NO_PEER)
            continue;
        PyObject *v = PyLong_FromLongLong(s->keys[i]);
        if (v == NULL || PySet_Add(set, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(set);
            return NULL;
        }
        Py_DECREF(v);
    }
    return set;
}

/* ---- streams and their open groups of Send/Recv (p2p.Group) ---------------------------------------------- */

typedef struct {
    int64_t peer, dtype;
    size_t off;                              /* who, count, rest, grank: in the group's arena from here */
    Py_ssize_t who_n, count_n, rest_n, grank_n;
    int send;
    PyObject *rec; /* a CallRecord (owned), or NULL for a line read here or a LineKey */
} Item;

typedef struct Stream Stream;
typedef struct Group Group;

/* An open group: made when a stream's Send/Recv opens one, and given back (to the engine's pool or the allocator)
 * when it ends, so a stream holds no buffers between groups. */
struct Group {
    Stream *stream;
    Group *prev, *next; /* the engine's open groups, oldest first (the order of p2p.P2pGrouper.open) */
    int records;
    int64_t n;
    Py_ssize_t opcount_n; /* the group's opCount: arena[0:opcount_n] */
    char *arena;
    size_t arena_len, arena_cap;
    Item *items;
    size_t n_items, cap_items;
    IntSet sends, recvs;
};

/* What the engine keeps of a stream (a process and a communicator) for the whole read. */
struct Stream {
    Group *open; /* its open group, or NULL */
    /* --jobs piece mode: the stream's opCount changed in this piece (settled), and until then its last opCount */
    char *last;
    Py_ssize_t last_n;
    int settled, has_last;
};

/* Streams by id (process id + communicator id, as p2p.P2pGrouper numbers them): 16 bytes a slot, half full at most. */
typedef struct {
    int64_t sid;
    Stream *stream; /* NULL: empty slot */
} StreamSlot;

typedef struct {
    StreamSlot *slots; /* NULL: not set up */
    size_t mask, used;
} StreamMap;

static int streammap_init(StreamMap *m, size_t cap) {
    m->slots = PyMem_Calloc(cap, sizeof(StreamSlot));
    if (m->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    m->mask = cap - 1;
    m->used = 0;
    return 0;
}

static void streammap_free(StreamMap *m) {
    StreamSlot *slots = m->slots;
    if (slots == NULL)
        return;
    m->slots = NULL;
    for (size_t i = 0; i <= m->mask; i++)
        if (slots[i].stream != NULL) {
            PyMem_Free(slots[i].stream->last);
            PyMem_Free(slots[i].stream);
        }
    PyMem_Free(slots);
}

/* The Stream of sid, made on first use (its address never changes); NULL with an exception set. */
static Stream *streammap_get(StreamMap *m, int64_t sid) {
    size_t i = mix((uint64_t)sid) & m->mask;
    for (; m->slots[i].stream != NULL; i = (i + 1) & m->mask)
        if (m->slots[i].sid == sid)
            return m->slots[i].stream;
    if ((m->used + 1) * 2 > m->mask + 1) {
        StreamMap bigger;
        if (streammap_init(&bigger, (m->mask + 1) * 2) < 0)
            return NULL;
        for (size_t j = 0; j <= m->mask; j++) {
            if (m->slots[j].stream == NULL)
                continue;
            size_t k = mix((uint64_t)m->slots[j].sid) & bigger.mask;
            while (bigger.slots[k].stream != NULL)
                k = (k + 1) & bigger.mask;
            bigger.slots[k] = m->slots[j];
        }
        bigger.used = m->used;
        PyMem_Free(m->slots);
        *m = bigger;
        return streammap_get(m, sid);
    }
    Stream *st = PyMem_Calloc(1, sizeof(Stream));
    if (st == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    m->slots[i].sid = sid;
    m->slots[i].stream = st;
    m->used++;
    return st;
}

/* ---- the engine ----------------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *proc_of; /* who token -> process id (p2p.P2pGrouper._proc_id of parse.who_fields) */
    PyObject *rest_of; /* rest span -> (comm id, nranks, datatype, peer) */
    PyObject *emit;    /* a group holding CallRecords -> the Python tally (analyze._Tally) */
    int group_p2p;     /* 0: --raw-p2p, Send/Recv counted as logged */
    int piece;         /* a --jobs worker's engine: head, settled and open groups go back to the parent */
    int ready;         /* __init__ set the engine up */
    int busy;          /* a method is running: a call from one of its callbacks is refused */
    PyObject *head, *settled; /* piece mode: lists (piece_end's docstring) */
    Table who_cache, rest_cache, stream_cache, raw, merged;
    StreamMap streams;
    Group *first, *last; /* open groups, oldest first */
    Group *pool;         /* ended groups kept for reuse (their buffers), linked by next */
    int pool_n;
    char *scratch;
    size_t scratch_cap;
    PyObject *weakrefs;
} Engine;

/* The engine's scratch buffer (a key being built) holds at least need bytes; -1 with an exception set. */
static int scratch_reserve(Engine *self, size_t need) {
    if (need <= self->scratch_cap)
        return 0;
    char *scratch = PyMem_Realloc(self->scratch, need * 2);
    if (scratch == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->scratch = scratch;
    self->scratch_cap = need * 2;
    return 0;
}

/* Key lengths are stored in 4 bytes: a span is part of one line, and lines are cut at 1 MiB (parse.py), but a
 * LineKey fed from Python could be anything. */
static int span_fits(Span s) {
    if ((uint64_t)s.n <= UINT32_MAX)
        return 1;
    PyErr_SetString(PyExc_OverflowError, "a field longer than 4 GiB");
    return 0;
}

/* A tally key: the five spans of (who, b"", b"", op, count, rest, grank, b"") with their lengths. */
static int tally_add(Engine *self, Table *t, Span who, Span op, Span count, Span rest, Span grank, int64_t n) {
    Span parts[5] = {who, op, count, rest, grank};
    size_t need = 0;
    for (int i = 0; i < 5; i++) {
        if (!span_fits(parts[i]))
            return -1;
        need += 4 + (size_t)parts[i].n;
    }
    if (scratch_reserve(self, need) < 0)
        return -1;
    char *w = self->scratch;
    for (int i = 0; i < 5; i++) {
        uint32_t len = (uint32_t)parts[i].n;
        memcpy(w, &len, 4);
        memcpy(w + 4, parts[i].p, (size_t)parts[i].n);
        w += 4 + parts[i].n;
    }
    int created;
    Slot *s = table_get(t, self->scratch, (Py_ssize_t)need, hash_bytes(self->scratch, (Py_ssize_t)need, 0), &created);
    if (s == NULL)
        return -1;
    s->v[0] += n;
    return 0;
}

static const Span SEND = {"Send", 4}, RECV = {"Recv", 4}, EMPTY = {"", 0};

static Span item_span(const Group *g, const Item *it, int which) {
    const char *p = g->arena + it->off;
    Py_ssize_t lens[4] = {it->who_n, it->count_n, it->rest_n, it->grank_n};
    for (int i = 0; i < which; i++)
        p += lens[i];
    return (Span){p, lens[which]};
}

static int64_t parse_u64(Span s) { /* 1 to 17 digits: below 10**17, no overflow */
    int64_t v = 0;
    for (Py_ssize_t i = 0; i < s.n; i++)
        v = v * 10 + (s.p[i] - '0');
    return v;
}

/* p2p.Group.alltoall and alltoall_count for a group of lines: 1 and (op, count) when it is an all-to-all. */
static int group_alltoall(const Group *g, const char **op, int64_t *count) {
    int64_t n = g->n;
    const IntSet *peers = &g->sends;
    if (n < 2 || peers->used == 0 || peers->used != g->recvs.used) /* both empty cannot happen: a group has a line */
        return 0;
    for (size_t i = 0; i <= peers->mask; i++) {
        int64_t k = peers->keys[i];
        if (k == NO_PEER)
            continue;
        if (!intset_has(&g->recvs, k) || k < 0 || k >= n)
            return 0;
    }
    if (!((int64_t)peers->used == n || (n >= 3 && (int64_t)peers->used == n - 1)))
        return 0;
    const Item *items = g->items;
    for (size_t i = 1; i < g->n_items; i++)
        if (items[i].dtype != items[0].dtype)
            return 0;
    *op = "AlltoAll";
    int all_equal = 1, leading_zero = 0;
    Span first = item_span(g, &items[0], 1);
    for (size_t i = 0; i < g->n_items; i++) {
        Span c = item_span(g, &items[i], 1);
        if (c.n > 17) {
            *count = OUT_OF_RANGE;
            return 1;
        }
        if (c.n != first.n || memcmp(c.p, first.p, (size_t)c.n) != 0)
            all_equal = 0;
        if (c.n > 0 && c.p[0] == '0')
            leading_zero = 1;
    }
    int64_t v0 = parse_u64(first);
    if (all_equal) {
        *count = v0;
        return 1;
    }
    if (leading_zero) {
        int same = 1;
        for (size_t i = 1; i < g->n_items && same; i++)
            same = parse_u64(item_span(g, &items[i], 1)) == v0;
        if (same) {
            *count = v0;
            return 1;
        }
    }
    /* at most 4·n + 8 counts below 10**17: the sum fits 128 bits and the mean 63 */
    unsigned __int128 sent = 0;
    for (size_t i = 0; i < g->n_items; i++)
        if (items[i].send)
            sent += (unsigned __int128)parse_u64(item_span(g, &items[i], 1));
    *op = "AlltoAllv";
    *count = (int64_t)((sent + (unsigned __int128)n - 1) / (unsigned __int128)n);
    return 1;
}

static PyObject *line_key(Span who, int send, Span opcount, Span count, Span rest, Span grank) {
    /* the LineKey the Python reader would have made: (who, Send|Recv, opCount, b"", count, rest, grank, b"") */
    return Py_BuildValue("(y#y#y#y#y#y#y#y#)", who.p, who.n, send ? "Send" : "Recv", (Py_ssize_t)4, opcount.p,
                         opcount.n, "", (Py_ssize_t)0, count.p, count.n, rest.p, rest.n, grank.p, grank.n, "",
                         (Py_ssize_t)0);
}

static PyObject *item_key(const Group *g, const Item *it) {
    return line_key(item_span(g, it, 0), it->send, (Span){g->arena, g->opcount_n}, item_span(g, it, 1),
                    item_span(g, it, 2), item_span(g, it, 3));
}

/* Append o (a new reference, or NULL with an exception set) to list, dropping the reference: 0, or -1. */
static int append_new(PyObject *list, PyObject *o) {
    int rc = o == NULL ? -1 : PyList_Append(list, o);
    Py_XDECREF(o);
    return rc;
}

/* ---- opening and ending groups -------------------------------------------------------------------------- */

static size_t group_bytes(const Group *g) {
    return sizeof(Group) + g->arena_cap + g->cap_items * sizeof(Item) + intset_bytes(&g->sends) +
           intset_bytes(&g->recvs);
}

static void group_free(Group *g) {
    PyMem_Free(g->arena);
    PyMem_Free(g->items);
    PyMem_Free(g->sends.keys);
    PyMem_Free(g->recvs.keys);
    PyMem_Free(g);
}

/* End g: drop its CallRecords, take it off the open list and its stream, and keep its buffers for the next group
 * (a few small ones: a stream that met many peers once does not keep what it held) or free them. */
static void group_close(Engine *self, Group *g) {
    for (size_t i = 0; i < g->n_items; i++)
        Py_CLEAR(g->items[i].rec); /* may run Python code: the busy flag keeps it out of the engine */
    g->n_items = 0;
    *(g->prev ? &g->prev->next : &self->first) = g->next;
    *(g->next ? &g->next->prev : &self->last) = g->prev;
    g->stream->open = NULL;
    g->stream = NULL;
    if (self->pool_n < POOL_MAX && group_bytes(g) <= POOL_BYTES) {
        g->next = self->pool;
        self->pool = g;
        self->pool_n++;
    } else {
        group_free(g);
    }
}

/* A new open group of stream st with opCount opcount, at the end of the open list, its arena room for `more`
 * bytes after the opCount (its first line's spans); NULL with an exception set. */
static Group *group_open(Engine *self, Stream *st, Span opcount, int64_t n, size_t more) {
    Group *g = self->pool;
    if (g != NULL) {
        self->pool = g->next;
        self->pool_n--;
    } else if ((g = PyMem_Calloc(1, sizeof(Group))) == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    if (g->arena == NULL || g->arena_cap < (size_t)opcount.n + more) { /* never NULL: memcpy/memcmp take it */
        char *a = PyMem_Realloc(g->arena, (size_t)opcount.n + more);
        if (a == NULL) {
            group_free(g);
            PyErr_NoMemory();
            return NULL;
        }
        g->arena = a;
        g->arena_cap = (size_t)opcount.n + more;
    }
    memcpy(g->arena, opcount.p, (size_t)opcount.n);
    g->opcount_n = opcount.n;
    g->arena_len = (size_t)opcount.n;
    g->n_items = 0;
    g->records = 0;
    g->n = n;
    intset_clear(&g->sends);
    intset_clear(&g->recvs);
    g->stream = st;
    st->open = g;
    g->next = NULL;
    g->prev = self->last;
    *(self->last ? &self->last->next : &self->first) = g;
    self->last = g;
    return g;
}

/* Room in g for one more item of `bytes` bytes of spans and one more peer in set: buffers start small (most
 * streams of a log with many communicators hold one line) and double. -1 with an exception set. */
static int group_reserve(Group *g, size_t bytes, IntSet *set) {
    if (g->arena_len + bytes > g->arena_cap) {
        size_t cap = g->arena_cap * 2 > g->arena_len + bytes ? g->arena_cap * 2 : g->arena_len + bytes;
        char *a = PyMem_Realloc(g->arena, cap);
        if (a == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        g->arena = a;
        g->arena_cap = cap;
    }
    if (g->n_items == g->cap_items) {
        size_t cap = g->cap_items ? g->cap_items * 2 : 2;
        Item *items = PyMem_Realloc(g->items, cap * sizeof(Item));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        g->items = items;
        g->cap_items = cap;
    }
    return intset_reserve(set);
}

/* A finished group: counted here when it is lines only (analyze._Tally._emit's rules), else handed to Python.
 * Ended either way (also on an error). */
static int group_emit(Engine *self, Group *g) {
    int rc = 0;
    if (g->records) {
        PyObject *items = PyList_New((Py_ssize_t)g->n_items), *sends = NULL, *recvs = NULL, *res = NULL;
        if (items == NULL) {
            group_close(self, g);
            return -1;
        }
        for (size_t i = 0; i < g->n_items; i++) {
            PyObject *o = g->items[i].rec;
            if (o != NULL)
                Py_INCREF(o);
            else if ((o = item_key(g, &g->items[i])) == NULL) {
                rc = -1;
                goto done;
            }
            PyList_SET_ITEM(items, (Py_ssize_t)i, o);
        }
        if ((sends = intset_to_py(&g->sends)) == NULL || (recvs = intset_to_py(&g->recvs)) == NULL) {
            rc = -1;
            goto done;
        }
        res = PyObject_CallFunction(self->emit, "y#LOOO", g->arena, g->opcount_n, (long long)g->n, items, sends,
                                    recvs);
        rc = res == NULL ? -1 : 0;
    done:
        Py_XDECREF(res);
        Py_XDECREF(sends);
        Py_XDECREF(recvs);
        Py_DECREF(items);
        group_close(self, g);
        return rc;
    }
    const char *op;
    int64_t count;
    if (group_alltoall(g, &op, &count)) {
        char digits[24]; /* an int64 in decimal: at most 20 characters and the NUL */
        int len = snprintf(digits, sizeof digits, "%lld", (long long)count);
        const Item *it = &g->items[0];
        rc = tally_add(self, &self->merged, item_span(g, it, 0), (Span){op, (Py_ssize_t)strlen(op)},
                       (Span){digits, len}, item_span(g, it, 2), item_span(g, it, 3), 1);
    } else {
        for (size_t i = 0; i < g->n_items && rc == 0; i++) {
            const Item *it = &g->items[i];
            rc = tally_add(self, &self->raw, item_span(g, it, 0), it->send ? SEND : RECV, item_span(g, it, 1),
                           item_span(g, it, 2), item_span(g, it, 3), 1);
        }
    }
    group_close(self, g);
    return rc;
}

/* Piece mode (analyze._PieceSink's rules): until its opCount changes in the piece, a stream's Send/Recv may
 * continue a group of the piece before; they go to head, in log order, for the parent. 1: the item went to head;
 * 0: the stream settles here (the item is grouped); -1 with an exception set. */
static int piece_head(Engine *self, Stream *st, Span opcount, int send, Span who, Span count, Span rest, Span grank,
                      PyObject *rec) {
    if (st->has_last && (st->last_n != opcount.n || memcmp(st->last, opcount.p, (size_t)opcount.n) != 0)) {
        st->settled = 1; /* for good: its last opCount is not needed again */
        PyMem_Free(st->last);
        st->last = NULL;
        /* the stream, for the parent: its (who, rest) spans, or the CallRecord */
        return append_new(self->settled,
                          rec != NULL ? Py_NewRef(rec) : Py_BuildValue("(y#y#)", who.p, who.n, rest.p, rest.n));
    }
    if (!st->has_last) {
        char *last = PyMem_Malloc((size_t)opcount.n + 1);
        if (last == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(last, opcount.p, (size_t)opcount.n);
        st->last = last;
        st->last_n = opcount.n;
        st->has_last = 1;
    }
    PyObject *o = rec != NULL ? Py_NewRef(rec) : line_key(who, send, opcount, count, rest, grank);
    return append_new(self->head, o) < 0 ? -1 : 1;
}

/* p2p.P2pGrouper._feed's 4·n + 8 line cap, without overflow (n is within ±2**62): n <= -2 ends every group. */
static int64_t group_limit(int64_t n) {
    if (n >= INT64_C(1) << 60)
        return INT64_MAX;
    return n <= -2 ? 0 : 4 * n + 8;
}

/* p2p.P2pGrouper._feed: one Send/Recv in log order. Spans who..grank are copied (the block goes away). */
static int feed(Engine *self, Stream *st, int64_t n, Span opcount, int64_t peer, int send, int64_t dtype, Span who,
                Span count, Span rest, Span grank, PyObject *rec) {
    if (self->piece && !st->settled) {
        int r = piece_head(self, st, opcount, send, who, count, rest, grank, rec);
        if (r != 0)
            return r < 0 ? -1 : 0;
    }
    Group *g = st->open;
    if (g != NULL && (g->opcount_n != opcount.n || memcmp(g->arena, opcount.p, (size_t)opcount.n) != 0 ||
                      intset_has(send ? &g->sends : &g->recvs, peer) || (int64_t)g->n_items >= group_limit(n))) {
        if (group_emit(self, g) < 0)
            return -1;
        g = NULL;
    }
    size_t bytes = (size_t)who.n + (size_t)count.n + (size_t)rest.n + (size_t)grank.n;
    if (g == NULL && (g = group_open(self, st, opcount, n, bytes)) == NULL)
        return -1;
    IntSet *set = send ? &g->sends : &g->recvs;
    if (group_reserve(g, bytes, set) < 0) {
        if (g->n_items == 0)
            group_close(self, g); /* no empty group stays open */
        return -1;
    }
    /* nothing below can fail: the item goes in whole or not at all */
    Item *it = &g->items[g->n_items++];
    it->peer = peer;
    it->dtype = dtype;
    it->send = send;
    it->off = g->arena_len;
    it->who_n = who.n;
    it->count_n = count.n;
    it->rest_n = rest.n;
    it->grank_n = grank.n;
    char *w = g->arena + g->arena_len;
    memcpy(w, who.p, (size_t)who.n);
    memcpy(w += who.n, count.p, (size_t)count.n);
    memcpy(w += count.n, rest.p, (size_t)rest.n);
    memcpy(w += rest.n, grank.p, (size_t)grank.n);
    g->arena_len = (size_t)(w + grank.n - g->arena);
    it->rec = Py_XNewRef(rec);
    g->records |= rec != NULL;
    intset_insert(set, peer);
    if ((int64_t)g->sends.used == n && (int64_t)g->recvs.used == n)
        return group_emit(self, g);
    return 0;
}

static int in_bounds(int64_t v) { return v >= -BOUND && v <= BOUND; }

/* fn(key)'s values, cached in t: who -> [process id]; rest -> [comm id, nranks, datatype, peer]. The callback runs
 * before the table is touched, so its exception leaves no half-made entry and no slot pointer is held across it.
 * 0, or -1 with an exception set. */
static int cached(Table *t, PyObject *fn, Span key, int nvalues, int64_t *out) {
    uint64_t h = hash_bytes(key.p, key.n, 0);
    const Slot *hit = table_find(t, key.p, key.n, h);
    if (hit != NULL) {
        memcpy(out, hit->v, (size_t)nvalues * sizeof(int64_t));
        return 0;
    }
    PyObject *res = PyObject_CallFunction(fn, "y#", key.p, key.n);
    if (res == NULL)
        return -1;
    if (nvalues == 1) {
        out[0] = PyLong_AsLongLong(res);
    } else if (!PyTuple_Check(res) || PyTuple_GET_SIZE(res) != nvalues) {
        PyErr_SetString(PyExc_TypeError, "rest_of must return a 4-tuple of ints");
    } else {
        for (int i = 0; i < nvalues && !PyErr_Occurred(); i++)
            out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(res, i));
        if (!PyErr_Occurred() && (!in_bounds(out[1]) || !in_bounds(out[3])))
            PyErr_SetString(PyExc_ValueError, "rest_of: nranks and peer must be within ±2**62");
    }
    Py_DECREF(res);
    if (PyErr_Occurred())
        return -1;
    if (t->used >= CACHE_LIMIT)
        table_clear(t); /* per-line junk in these spans: the cache stays bounded */
    int created;
    Slot *s = table_get(t, key.p, key.n, h, &created);
    if (s == NULL)
        return -1;
    memcpy(s->v, out, (size_t)nvalues * sizeof(int64_t));
    return 0;
}

/* A Send/Recv line: its stream, communicator size, datatype and peer come from one lookup of (who, rest) in
 * stream_cache (filled from the who and rest caches, which call Python once per distinct span). */
static int feed_p2p(Engine *self, Span who, int send, Span opcount, Span count, Span rest, Span grank) {
    if (!span_fits(who))
        return -1;
    size_t need = 4 + (size_t)who.n + (size_t)rest.n;
    if (scratch_reserve(self, need) < 0)
        return -1;
    uint32_t who_n = (uint32_t)who.n;
    memcpy(self->scratch, &who_n, 4);
    memcpy(self->scratch + 4, who.p, (size_t)who.n);
    memcpy(self->scratch + 4 + who.n, rest.p, (size_t)rest.n);
    Table *t = &self->stream_cache;
    uint64_t h = hash_bytes(self->scratch, (Py_ssize_t)need, 0);
    const Slot *hit = table_find(t, self->scratch, (Py_ssize_t)need, h);
    Stream *st;
    int64_t v[4]; /* nranks, datatype, peer */
    if (hit != NULL) {
        st = (Stream *)(intptr_t)hit->v[0];
        memcpy(v, hit->v, sizeof v);
    } else {
        int64_t proc, r[4];
        if (cached(&self->who_cache, self->proc_of, who, 1, &proc) < 0 ||
            cached(&self->rest_cache, self->rest_of, rest, 4, r) < 0)
            return -1;
        /* the stream id as p2p adds it; wrapping (not undefined) where a callback returned absurd ids */
        if ((st = streammap_get(&self->streams, (int64_t)((uint64_t)proc + (uint64_t)r[0]))) == NULL)
            return -1;
        if (t->used >= CACHE_LIMIT)
            table_clear(t); /* per-line junk in these spans: the cache stays bounded (the Streams live in streams) */
        int created;
        Slot *s = table_get(t, self->scratch, (Py_ssize_t)need, h, &created); /* the scratch key is unchanged */
        if (s == NULL)
            return -1;
        s->v[0] = (int64_t)(intptr_t)st;
        s->v[1] = v[1] = r[1]; /* nranks */
        s->v[2] = v[2] = r[2]; /* datatype */
        s->v[3] = v[3] = r[3]; /* peer */
    }
    return feed(self, st, v[1], opcount, v[3], send, v[2], who, count, rest, grank, NULL);
}
/* ---- one call line: parse.LINE's first alternative, within the line ------------------------------------ */

typedef struct {
    Span who, op, opcount, count, rest, grank;
    int p2p, send;
    const char *end; /* where the call ends in the line */
} Line;

static inline int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static inline int is_digit(char c) { return c >= '0' && c <= '9'; }
static inline int is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static inline int is_alnum(char c) { return is_alpha(c) || is_digit(c); }
static inline int is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static inline int lit(const char **p, const char *end, const char *s, Py_ssize_t n) {
    if (end - *p < n || memcmp(*p, s, (size_t)n) != 0)
        return 0;
    *p += n;
    return 1;
}
#define LIT(p, end, s) lit(p, end, s, (Py_ssize_t)(sizeof(s) - 1))

static inline int digits(const char **p, const char *end) { /* \d++ */
    const char *s = *p;
    while (*p < end && is_digit(**p))
        (*p)++;
    return *p > s;
}

/* A second "opCount " in a call line can only end a token of its own (sendbuff, recvbuff, acc, comm, stream: no
 * literal of the call holds "opC"): [s, e) ends in "opCount" and a space follows. Such a line is torn. */
static INLINE int ends_in_opcount(const char *s, const char *e, const char *end) {
    return e[-1] == 't' && e - s >= 7 && e < end && *e == ' ' && memcmp(e - 7, "opCoun", 6) == 0;
}

static INLINE int token(const char **p, const char *end) { /* [^ ]++ within the line, not ending a torn line */
    const char *s = *p;
    while (*p < end && **p != ' ')
        (*p)++;
    return *p > s && !ends_in_opcount(s, *p, end);
}

/* ls: the line's first byte; oc: its first "opCount "; le: its end (the newline or the block's end). 1 and L filled
 * when LINE reads the line as a call; 0 when the Python reader must decide. A torn line (a second "opCount "
 * anywhere after the first one's start, the call's own tokens included: a stream token "opCount" before a space is
 * one) is the Python reader's: it reads its call and counts its fragments. This checks the call's tokens; the
 * caller checks the rest of the line from L->end. */
static int parse_line(const char *ls, const char *oc, const char *le, Line *L) {
    /* backwards from "opCount ": "<who> [<dev>] [<timestamp> ]NCCL INFO <op>: " */
    if (oc - ls < 2 || oc[-1] != ' ' || oc[-2] != ':')
        return 0;
    const char *oe = oc - 2, *os = oe;
    while (os > ls && is_alnum(os[-1]))
        os--;
    if (os == oe || !is_alpha(*os) || os - ls < 11 || memcmp(os - 10, "NCCL INFO ", 10) != 0 || os[-11] != ' ')
        return 0;
    const char *t = os - 11; /* the space before NCCL */
    if (t == ls)
        return 0;
    if (t[-1] != ']') { /* a timestamp: [0-9.]++ */
        const char *u = t;
        while (u > ls && (is_digit(u[-1]) || u[-1] == '.'))
            u--;
        if (u == t || u - ls < 2 || u[-1] != ' ' || u[-2] != ']')
            return 0;
        t = u - 1;
    }
    const char *close = t - 1, *ds = close; /* "[-?\d++]" */
    while (ds > ls && is_digit(ds[-1]))
        ds--;
    if (ds == close)
        return 0;
    if (ds > ls && ds[-1] == '-')
        ds--;
    if (ds - ls < 2 || ds[-1] != '[' || ds[-2] != ' ')
        return 0;
    const char *we = ds - 2, *ws = we;
    while (ws > ls && !is_ws(ws[-1]))
        ws--;
    if (ws == we)
        return 0;
    for (const char *c = ls; c < ws; c++) /* tokens separated by single spaces before the who token */
        if (is_ws(*c) && *c != ' ')
            return 0;
    L->who = (Span){ws, close + 1 - ws};
    L->op = (Span){os, oe - os};
    L->p2p = L->op.n == 4 && (memcmp(os, "Send", 4) == 0 || memcmp(os, "Recv", 4) == 0);
    L->send = L->p2p && os[0] == 'S';

    /* forwards */
    const char *p = oc + 8, *s = p;
    while (p < le && is_hex(*p))
        p++;
    if (p == s)
        return 0;
    L->opcount = (Span){s, p - s};
    if (!LIT(&p, le, " sendbuff ") || !token(&p, le) || !LIT(&p, le, " recvbuff ") || !token(&p, le) ||
        !LIT(&p, le, " "))
        return 0;
    const char *save = p;
    if (!(LIT(&p, le, "acc ") && token(&p, le) && LIT(&p, le, " ")))
        p = save;
    if (!LIT(&p, le, "count "))
        return 0;
    s = p;
    if (!digits(&p, le))
        return 0;
    L->count = (Span){s, p - s};
    if (!LIT(&p, le, " "))
        return 0;
    s = p;
    if (!LIT(&p, le, "datatype ") || !digits(&p, le) || !LIT(&p, le, " op ") || !digits(&p, le) ||
        !LIT(&p, le, " root "))
        return 0;
    if (p < le && *p == '-')
        p++;
    if (!digits(&p, le) || !LIT(&p, le, " comm ") || !token(&p, le) || !LIT(&p, le, " [nranks=") || !digits(&p, le) ||
        !LIT(&p, le, "]"))
        return 0;
    L->rest = (Span){s, p - s};
    if (!LIT(&p, le, " stream "))
        return 0;
    s = p;
    while (p < le && !is_ws(*p))
        p++;
    if (p == s || ends_in_opcount(s, p, le))
        return 0;
    L->grank = EMPTY;
    save = p;
    if (LIT(&p, le, " task ")) {
        if (p < le && *p == '-')
            p++;
        if (digits(&p, le) && LIT(&p, le, " globalrank ")) {
            s = p;
            if (p < le && *p == '-')
                p++;
            if (digits(&p, le))
                L->grank = (Span){s, p - s};
        }
    }
    if (L->grank.n == 0)
        p = save;
    L->end = p;
    return 1;
}

/* The last newline in [p, end); p is one. */
static inline const char *last_newline(const char *p, const char *end) {
#ifdef __GLIBC__
    return memrchr(p, '\n', (size_t)(end - p));
#else
    while (*--end != '\n')
        ;
    return end;
#endif
}

static Py_ssize_t count_newlines(const char *p, const char *end) {
    Py_ssize_t n = 0;
    while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        n++;
        p++;
    }
    return n;
}

/* The offset of the newline before the first line of [p, end) that holds "Init COMPLETE" (p: a newline), or -1:
 * the Python reader reads those lines (LINE hands them over). */
static Py_ssize_t init_line(const char *b, const char *p, const char *end) {
    const char *hit = end - p >= 13 ? memmem(p, (size_t)(end - p), "Init COMPLETE", 13) : NULL;
    if (hit == NULL)
        return -1;
    return last_newline(p, hit) - b;
}

/* Every method starts here: the engine must be set up by __init__, and not be running a method already (a
 * callback that calls back in would change the tables under the method that called it). Leave with leave(). */
static int enter(Engine *self) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Engine is busy: its callbacks cannot call it");
        return -1;
    }
    if (!self->ready) {
        PyErr_SetString(PyExc_RuntimeError, "Engine is not initialised (Engine.__init__ did not run)");
        return -1;
    }
    self->busy = 1;
    return 0;
}
static PyObject *leave(Engine *self, PyObject *result) { /* result: the method's, computed before the call */
    self->busy = 0;
    return result;
}

/* Engine.scan(block, pos) -> (calls, stop, newlines): read the call lines of block (bytes: it cannot change under
 * the engine) from pos (a newline's offset, or len(block)) on. stop is the offset of the newline that starts a
 * line left to the Python reader (a torn line, a call LINE would not read, an Init COMPLETE line), or -1 at the
 * block's end; newlines counts the newlines of block[pos:stop] (block[pos:] at the end). Each call line read holds
 * exactly one "opCount ". */
static PyObject *scan(Engine *self, PyObject *args) {
    PyObject *block;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "Sn", &block, &pos))
        return NULL;
    const char *b = PyBytes_AS_STRING(block), *end = b + PyBytes_GET_SIZE(block);
    if (pos < 0 || pos > PyBytes_GET_SIZE(block) || (pos < PyBytes_GET_SIZE(block) && b[pos] != '\n')) {
        PyErr_SetString(PyExc_ValueError, "scan: pos must be the offset of a newline in the block, or its length");
        return NULL;
    }
    const char *p = b + pos, *oc = end - p >= 8 ? memmem(p, (size_t)(end - p), "opCount ", 8) : NULL;
    Py_ssize_t calls = 0, stop = -1, newlines = 0;
    while (p < end) {
        if (oc == NULL) {
            stop = init_line(b, p, end);
            break;
        }
        const char *nl = last_newline(p, oc);
        if (nl > p && (stop = init_line(b, p, nl)) >= 0)
            break;
        const char *le = memchr(oc, '\n', (size_t)(end - oc));
        if (le == NULL)
            le = end;
        Line L;
        const char *next = NULL;
        int read = parse_line(nl + 1, oc, le, &L);
        if (read) { /* one search from the call's end: the next line's "opCount ", or a second one in this line */
            next = end - L.end >= 8 ? memmem(L.end, (size_t)(end - L.end), "opCount ", 8) : NULL;
            read = next == NULL || next >= le;
        }
        if (!read) {
            stop = nl - b;
            break;
        }
        int rc;
        if (L.p2p && self->group_p2p)
            rc = feed_p2p(self, L.who, L.send, L.opcount, L.count, L.rest, L.grank);
        else
            rc = tally_add(self, &self->raw, L.who, L.op, L.count, L.rest, L.grank, 1);
        if (rc < 0)
            return NULL;
        calls++;
        newlines += count_newlines(p, nl + 1);
        p = le;
        oc = next;
    }
    newlines += count_newlines(p, stop >= 0 ? b + stop : end);
    return Py_BuildValue("nnn", calls, stop, newlines);
}

static int span_of(PyObject *tuple, Py_ssize_t i, Span *s) {
    PyObject *o = PyTuple_GET_ITEM(tuple, i);
    if (!PyBytes_Check(o)) {
        PyErr_SetString(PyExc_TypeError, "LineKey fields must be bytes");
        return -1;
    }
    s->p = PyBytes_AS_STRING(o);
    s->n = PyBytes_GET_SIZE(o);
    return 0;
}

/* Engine.feed_keys(keys): Send/Recv LineKeys (parse.LineKey) read by the Python reader, in log order. */
static PyObject *feed_keys(Engine *self, PyObject *keys) {
    /* a tuple of them: the caller's list may change while a callback runs, a tuple of bytes cannot */
    PyObject *seq = PySequence_Tuple(keys);
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(seq, i);
        Span who, p2p, opcount, count, rest, grank;
        if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != 8) {
            PyErr_SetString(PyExc_TypeError, "a LineKey is an 8-tuple");
            goto fail;
        }
        if (span_of(k, 0, &who) < 0 || span_of(k, 1, &p2p) < 0 || span_of(k, 2, &opcount) < 0 ||
            span_of(k, 4, &count) < 0 || span_of(k, 5, &rest) < 0 || span_of(k, 6, &grank) < 0)
            goto fail;
        int digits_only = count.n > 0;
        for (Py_ssize_t j = 0; j < count.n && digits_only; j++)
            digits_only = is_digit(count.p[j]);
        if (!digits_only) { /* LINE's count is \d++; the all-to-all rules read it as a number */
            PyErr_SetString(PyExc_ValueError, "a LineKey's count must be decimal digits");
            goto fail;
        }
        if (feed_p2p(self, who, p2p.n == 4 && memcmp(p2p.p, "Send", 4) == 0, opcount, count, rest, grank) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* Engine.feed_record(sid, nranks, opcount, peer, is_send, record): one Send/Recv CallRecord, in log order. */
static PyObject *feed_record(Engine *self, PyObject *args) {
    long long sid, n, peer;
    PyObject *opcount, *rec;
    int send;
    if (!PyArg_ParseTuple(args, "LLSLpO", &sid, &n, &opcount, &peer, &send, &rec))
        return NULL;
    if (!in_bounds(n) || !in_bounds(peer)) { /* a parsed CallRecord's are: parse.bounded */
        PyErr_SetString(PyExc_ValueError, "feed_record: nranks and peer must be within ±2**62");
        return NULL;
    }
    Stream *st = streammap_get(&self->streams, sid);
    Span oc = {PyBytes_AS_STRING(opcount), PyBytes_GET_SIZE(opcount)};
    if (st == NULL || feed(self, st, n, oc, peer, send, 0, EMPTY, EMPTY, EMPTY, EMPTY, rec) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Engine.finish(): end every open group, oldest first (p2p.P2pGrouper.finish). */
static PyObject *finish(Engine *self) {
    while (self->first != NULL)
        if (group_emit(self, self->first) < 0) /* ends the group even then: a later call goes on from the next */
            return NULL;
    Py_RETURN_NONE;
}

/* Engine.piece_end() -> (head, tail, settled), piece mode's end: head (LineKeys and CallRecords in log order),
 * the items of the groups still open, not counted here (tail), and the streams whose opCount changed (settled:
 * a (who, rest) pair or a CallRecord each); analyze.read_piece turns them into a PieceResult. The lists are the
 * caller's: the engine starts new ones. */
static PyObject *piece_end(Engine *self) {
    if (!self->piece) {
        PyErr_SetString(PyExc_RuntimeError, "piece_end: this engine was not made with piece=True");
        return NULL;
    }
    PyObject *tail = PyList_New(0), *head = PyList_New(0), *settled = PyList_New(0);
    if (tail == NULL || head == NULL || settled == NULL)
        goto fail;
    while (self->first != NULL) {
        Group *g = self->first;
        for (size_t j = 0; j < g->n_items; j++) {
            PyObject *o = g->items[j].rec != NULL ? Py_NewRef(g->items[j].rec) : item_key(g, &g->items[j]);
            if (append_new(tail, o) < 0)
                goto fail;
        }
        group_close(self, g);
    }
    /* hand the lists over: the caller's from here, the engine goes on with new ones */
    PyObject *out = Py_BuildValue("(OOO)", self->head, tail, self->settled);
    if (out == NULL)
        goto fail;
    Py_SETREF(self->head, head);
    Py_SETREF(self->settled, settled);
    Py_DECREF(tail);
    return out;
fail:
    Py_XDECREF(tail);
    Py_XDECREF(head);
    Py_XDECREF(settled);
    return NULL;
}

static PyObject *counts_of(const Table *t) {
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i <= t->mask; i++) {
        const Slot *s = &t->slots[i];
        if (s->key == NULL)
            continue;
        Span f[5];
        const char *p = s->key;
        for (int j = 0; j < 5; j++) {
            uint32_t len;
            memcpy(&len, p, 4);
            f[j] = (Span){p + 4, (Py_ssize_t)len};
            p += 4 + len;
        }
        PyObject *item = Py_BuildValue("((y#y#y#y#y#y#y#y#)L)", f[0].p, f[0].n, "", (Py_ssize_t)0, "", (Py_ssize_t)0,
                                       f[1].p, f[1].n, f[2].p, f[2].n, f[3].p, f[3].n, f[4].p, f[4].n, "",
                                       (Py_ssize_t)0, (long long)s->v[0]);
        if (append_new(out, item) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* Engine.counts() -> (raw, merged): [(LineKey with opCount blank, calls)] of analyze._Tally.raw and .merged. */
static PyObject *counts(Engine *self) {
    PyObject *raw = counts_of(&self->raw), *merged = raw ? counts_of(&self->merged) : NULL;
    if (merged == NULL) {
        Py_XDECREF(raw);
        return NULL;
    }
    return Py_BuildValue("(NN)", raw, merged);
}

/* The methods, each between enter and leave. */
static PyObject *Engine_scan(Engine *self, PyObject *args) {
    return enter(self) < 0 ? NULL : leave(self, scan(self, args));
}
static PyObject *Engine_feed_keys(Engine *self, PyObject *keys) {
    return enter(self) < 0 ? NULL : leave(self, feed_keys(self, keys));
}
static PyObject *Engine_feed_record(Engine *self, PyObject *args) {
    return enter(self) < 0 ? NULL : leave(self, feed_record(self, args));
}
static PyObject *Engine_finish(Engine *self, PyObject *Py_UNUSED(ignored)) {
    return enter(self) < 0 ? NULL : leave(self, finish(self));
}
static PyObject *Engine_piece_end(Engine *self, PyObject *Py_UNUSED(ignored)) {
    return enter(self) < 0 ? NULL : leave(self, piece_end(self));
}
static PyObject *Engine_counts(Engine *self, PyObject *Py_UNUSED(ignored)) {
    return enter(self) < 0 ? NULL : leave(self, counts(self));
}

/* Drop everything the engine holds (tp_clear, dealloc): it is then as Engine.__new__ left it, and refuses every
 * method until __init__ runs again. */
static void engine_release(Engine *self) {
    int busy = self->busy;
    self->ready = 0;
    self->busy = 1; /* Python code run by the DECREFs below cannot call in */
    while (self->first != NULL)
        group_close(self, self->first);
    while (self->pool != NULL) {
        Group *g = self->pool;
        self->pool = g->next;
        group_free(g);
    }
    self->pool_n = 0;
    streammap_free(&self->streams);
    table_free(&self->who_cache);
    table_free(&self->rest_cache);
    table_free(&self->stream_cache);
    table_free(&self->raw);
    table_free(&self->merged);
    PyMem_Free(self->scratch);
    self->scratch = NULL;
    self->scratch_cap = 0;
    Py_CLEAR(self->proc_of);
    Py_CLEAR(self->rest_of);
    Py_CLEAR(self->emit);
    Py_CLEAR(self->head);
    Py_CLEAR(self->settled);
    self->busy = busy;
}

static int Engine_init(Engine *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"proc_of", "rest_of", "emit", "group_p2p", "piece", NULL};
    PyObject *proc_of, *rest_of, *emit;
    int group_p2p = 1, piece = 0;
    if (self->busy || self->ready) { /* a second __init__ would drop or mix up the state of a read */
        PyErr_SetString(PyExc_RuntimeError, self->busy ? "Engine is busy: its callbacks cannot call it"
                                                       : "Engine is already initialised: make a new one");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|pp", kwlist, &proc_of, &rest_of, &emit, &group_p2p, &piece))
        return -1;
    if (!PyCallable_Check(proc_of) || !PyCallable_Check(rest_of) || !PyCallable_Check(emit)) {
        PyErr_SetString(PyExc_TypeError, "Engine: proc_of, rest_of and emit must be callable");
        return -1;
    }
    /* what an __init__ that failed before made is reused, or freed with the engine */
    if (piece && self->head == NULL && (self->head = PyList_New(0)) == NULL)
        return -1;
    if (piece && self->settled == NULL && (self->settled = PyList_New(0)) == NULL)
        return -1;
    Table *tables[] = {&self->who_cache, &self->rest_cache, &self->stream_cache, &self->raw, &self->merged};
    for (int i = 0; i < 5; i++)
        if (tables[i]->slots == NULL && table_init(tables[i], 64) < 0)
            return -1;
    if (self->streams.slots == NULL && streammap_init(&self->streams, 64) < 0)
        return -1;
    Py_XSETREF(self->proc_of, Py_NewRef(proc_of));
    Py_XSETREF(self->rest_of, Py_NewRef(rest_of));
    Py_XSETREF(self->emit, Py_NewRef(emit));
    self->group_p2p = group_p2p;
    self->piece = piece;
    self->ready = 1;
    return 0;
}

/* The garbage collector's view: the engine holds its callbacks (a _Tally's bound methods: a cycle through the
 * _Tally that holds the engine), piece mode's lists and the CallRecords of its open groups. */
static int Engine_traverse(Engine *self, visitproc visit, void *arg) {
    Py_VISIT(self->proc_of);
    Py_VISIT(self->rest_of);
    Py_VISIT(self->emit);
    Py_VISIT(self->head);
    Py_VISIT(self->settled);
    for (const Group *g = self->first; g != NULL; g = g->next)
        for (size_t i = 0; i < g->n_items; i++)
            Py_VISIT(g->items[i].rec);
    return 0;
}

static int Engine_clear(Engine *self) {
    engine_release(self);
    return 0;
}

static void Engine_dealloc(Engine *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    engine_release(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Engine_methods[] = {
    {"scan", (PyCFunction)Engine_scan, METH_VARARGS, "scan(block, pos) -> (calls, stop, newlines)"},
    {"feed_keys", (PyCFunction)Engine_feed_keys, METH_O, "feed_keys(send_recv_line_keys)"},
    {"feed_record", (PyCFunction)Engine_feed_record, METH_VARARGS,
     "feed_record(sid, nranks, opcount, peer, is_send, record)"},
    {"finish", (PyCFunction)Engine_finish, METH_NOARGS, "end every open group"},
    {"counts", (PyCFunction)Engine_counts, METH_NOARGS, "counts() -> (raw, merged)"},
    {"piece_end", (PyCFunction)Engine_piece_end, METH_NOARGS, "piece_end() -> (head, tail, settled)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opbench.trace._scan.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Reads NCCL COLL call lines and groups Send/Recv (opbench.trace._scan).",
    .tp_alloc = PyType_GenericAlloc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_traverse = (traverseproc)Engine_traverse,
    .tp_clear = (inquiry)Engine_clear,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_free = PyObject_GC_Del,
    .tp_weaklistoffset = offsetof(Engine, weakrefs),
    .tp_methods = Engine_methods,
};

static struct PyModuleDef scan_module = {
    PyModuleDef_HEAD_INIT, "_scan", "Native reader of NCCL COLL call lines (docs/trace.md, \"Native reader\").", -1,
    NULL,
};

PyMODINIT_FUNC PyInit__scan(void) {
    if (PyType_Ready(&EngineType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&scan_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
