# Every message between gridsync processes.
#
# Data plane (worker <-> PS shard, ZeroMQ multipart): frame 0 is a Header;
# the frames after it are raw little-endian payload, per TableBlock in order:
#   push:      [row ids, unless dense] [values]
#   pull:      [row ids, unless dense]
#   pullReply: [values]
#   init:      [row ids, unless dense] [values]
# Row ids are strictly ascending, in the block's rowEncoding:
#   raw:         UInt32 x rowCount, little-endian (4 x rowCount bytes);
#   deltaVarint: rowCount unsigned LEB128 varints and nothing else: the first
#                row id, then each gap minus one (row[i] - row[i-1] - 1).
# Senders pick deltaVarint when it is strictly smaller than raw (hash-grid
# rows are dense enough that most gaps fit in one byte).
# Values are `width` floats per row (codec none), packed in row order, or
# with a codec the encoded bytes of those rowCount x width floats.
#
# Control plane (anyone <-> coordinator, TCP): each message is a 4-byte
# little-endian length followed by a flat (unpacked) Cap'n Proto message of
# CoordRequest or CoordReply.
@0xa7e47625dd6886bc;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("gridsync::wire::schema");

# 2: pull replies may come in parts (Header.partRow, moreParts), which a
# version-1 worker would take for a short reply.
# 3: the fp16 codec carries an exponent per block of codecBlock values
# (kernels/cpu/codec.h), which a version-2 peer would read as halves.
const protocolVersion :UInt16 = 3;

struct ErrorInfo {
  code @0 :UInt32;   # gridsync::StatusCode
  text @1 :Text;     # what is wrong and what is allowed
}

# ---- Data plane ----

enum MessageKind {
  push @0;       # gradient rows for a step
  pushAck @1;    # the shard accepted a push
  pull @2;       # parameter rows wanted
  pullReply @3;  # parameter rows
  error @4;      # the request was refused; nothing changed on the shard
  stats @5;      # ask a shard for its counters
  statsReply @6;
  init @7;       # initial parameter values (dense or sparse rows), before step 0
}

# Values encodings; wire formats in kernels/cpu/codec.h (numbers match its Codec).
enum Codec {
  none @0;     # float32 values
  fp16 @1;
  bf16 @2;
  int8 @3;
  qsgd @4;
  onebit @5;
  topk @6;
  randomk @7;
}

# How a sparse block's row-id frame is laid out. Dense blocks, and kinds
# that carry no row ids (pullReply), must leave it at raw.
enum RowEncoding {
  raw @0;          # UInt32 x rowCount, little-endian; the default, so older
                   # senders (which never set the field) stay valid
  deltaVarint @1;  # rowCount unsigned LEB128 varints (7 bits per byte, low
                   # group first, high bit = more follows, at most 5 bytes
                   # and 32 bits each): the first row id, then each gap minus
                   # one (rows are strictly ascending, so gaps are >= 1); the
                   # frame holds exactly rowCount varints and nothing else
}

struct TableBlock {
  table @0 :UInt32;      # index into the cluster map's tables
  rowCount @1 :UInt32;   # rows carried
  dense @2 :Bool;        # rows rowBegin .. rowBegin+rowCount-1, no row-id frame
  rowBegin @3 :UInt32;   # first row when dense
  colBegin @4 :UInt32;   # first column carried (column partitioning)
  width @5 :UInt32;      # columns carried per row
  codec @6 :Codec;
  codecRatio @7 :Float64;  # topk/randomk: fraction kept
  codecBits @8 :UInt8;     # qsgd: level bits
  codecBlock @9 :UInt32;   # int8, fp16: values per scale
  codecSeed @10 :UInt64;   # qsgd/randomk: the randomness both ends derive
  rowEncoding @11 :RowEncoding;  # layout of the row-id frame (sparse only)
}

# What a push's values are (ps.optimizer): gradients, for Adam on the shard,
# or parameter updates computed by the worker's own Adam, which the shard
# averages per row over the pushes that list the row and adds.
enum PushValues {
  gradients @0;
  updates @1;
}

struct ShardStats {
  appliedSteps @0 :UInt64;   # steps applied (the shard's parameter version)
  pushes @1 :UInt64;
  pulls @2 :UInt64;
  errors @3 :UInt64;
  rowsOwned @4 :UInt64;
  bytesIn @5 :UInt64;
  bytesOut @6 :UInt64;
}

struct Header {
  version @0 :UInt16;
  kind @1 :MessageKind;
  step @2 :UInt64;         # push: the step of these gradients; pullReply: appliedSteps
  workerRank @3 :UInt32;
  requestId @4 :UInt64;    # echoed in the reply
  shard @5 :UInt32;        # the shard addressed / replying
  minVersion @6 :UInt64;   # pull: reply once appliedSteps >= minVersion
  blocks @7 :List(TableBlock);
  error @8 :ErrorInfo;     # kind == error
  stats @9 :ShardStats;    # kind == statsReply
  numWorkers @10 :UInt32;  # push: workers expected to push this step (BSP/SSP)
  pushValues @11 :PushValues;  # push: gradients or updates
  wholeValues @12 :Bool;   # pull: parameters whole, never deltas against the
                           # worker's replica (compression.pull), e.g. the final pull
  skipStep @13 :Bool;      # push: this worker's gradients overflowed under mixed
                           # precision; the push carries no blocks and the shards
                           # apply none of the step's pushes (bsp, ssp) or skip it (async)
  evaluation @14 :Bool;    # pull (with wholeValues): for an evaluation mid-run; the
                           # shards leave their copy of the worker's replica alone
  job @15 :UInt64;         # the sender's job (the cluster map's job; 0: none). A
                           # long-running shard starts afresh for a newer job and
                           # refuses the messages of an older one
  epoch @16 :UInt32;       # the sender's epoch of its job (the cluster map's): it
                           # moves when a restarted shard rejoins and the job rolls
                           # back to a checkpoint; older epochs are refused
  partRow @17 :UInt64;     # pullReply: the reply may come in parts, in order, so
                           # the shard gathers the next while this one travels and
                           # the worker copies this one in. Its first row counted
                           # over the request's blocks in order (0 for the first
                           # part); a part's blocks continue the request's blocks
                           # from there (the first may resume one cut by the part
                           # before, the last may be cut). Other kinds: 0
  moreParts @18 :Bool;     # pullReply: more parts of this reply follow. Other kinds: false
}

# ---- Control plane ----

enum Role {
  shard @0;
  worker @1;
  observer @2;   # launcher, monitor, tests: reads the map, uses KV and barriers
}

struct TableInfo {
  name @0 :Text;
  rows @1 :UInt64;
  width @2 :UInt32;
}

struct Member {
  role @0 :Role;
  rank @1 :UInt32;        # shard index or worker rank
  node @2 :Text;          # node name (machine or group)
  localRank @3 :UInt32;   # rank inside the node
  endpoint @4 :Text;      # shard: its ZeroMQ endpoint
  pid @5 :UInt32;
}

struct ClusterMap {
  generation @0 :UInt64;      # bumped on every membership change
  expectedShards @1 :UInt32;
  expectedWorkers @2 :UInt32;
  shards @3 :List(Member);    # sorted by rank
  workers @4 :List(Member);   # sorted by rank
  tables @5 :List(TableInfo);
  job @6 :UInt64;             # the job of the workers in the map: a new one begins
                              # once every worker of the job before has left
  epoch @7 :UInt32;           # rollbacks of the job so far: a shard that rejoined
                              # from its checkpoint moved it
  resumeStep @8 :UInt64;      # the checkpoint step the job rolled back to at this epoch
}

struct RegisterRequest {
  role @0 :Role;
  requestedRank @1 :Int32;    # -1: assign the next free rank
  node @2 :Text;
  localRank @3 :UInt32;
  endpoint @4 :Text;
  pid @5 :UInt32;
  tables @6 :List(TableInfo); # must equal the cluster's tables
  rejoinStep @7 :UInt64;      # shard: rejoining the running job from its checkpoint of
                              # this step (0: a fresh shard)
  sharedSettings @8 :List(Setting);  # must equal the cluster's (spec/cluster_settings.h)
  jobSettings @9 :List(Setting);     # workers: must equal the job's
}

struct Setting {
  key @0 :Text;               # a config key
  value @1 :Text;             # its value, as JSON text
}

struct CoordRequest {
  requestId @0 :UInt64;
  union {
    register @1 :RegisterRequest;
    getMap :group {
      waitComplete @2 :Bool;   # wait until every expected member registered
      timeoutMs @3 :UInt32;
    }
    barrier :group {
      name @4 :Text;
      count @5 :UInt32;        # participants
      timeoutMs @6 :UInt32;
      member @7 :Text;         # who arrives, for "missing" messages
    }
    kvSet :group {
      key @8 :Text;
      value @9 :Data;
    }
    kvGet :group {
      keys @10 :List(Text);
      timeoutMs @11 :UInt32;   # 0: do not wait for missing keys
    }
    heartbeat @12 :Void;
    # security.curve: the first two requests of a connection. authHello asks
    # for a fresh random challenge; auth proves the role's key pair by
    # boxing it (libsodium crypto_box: the role's secret key and the
    # coordinator's public key). A box is good for its connection only.
    authHello @13 :Void;
    auth :group {
      role @14 :Role;
      nonce @15 :Data;   # crypto_box nonce, 24 bytes
      box @16 :Data;     # crypto_box of the 32-byte challenge
    }
  }
}

struct CoordReply {
  requestId @0 :UInt64;
  union {
    ok @1 :Void;
    error @2 :ErrorInfo;
    registered :group {
      rank @3 :UInt32;
      map @4 :ClusterMap;
    }
    map @5 :ClusterMap;
    values @6 :List(Data);     # kvGet, in key order
    challenge @7 :Data;        # authHello: 32 random bytes
  }
}
