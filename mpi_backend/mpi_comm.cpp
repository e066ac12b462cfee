#include "mpi_backend/mpi_comm.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <thread>

#include "core/errors.hpp"
#include "mpi_backend/detail/mpi_util.hpp"

namespace cocodiff::mpi {

// ---------------------------------------------------------------------------------------------
// detail

namespace detail {

std::shared_ptr<const std::vector<float>> Shared::zeros_of(std::int64_t n) {
  const auto need = static_cast<std::size_t>(std::max<std::int64_t>(n, 1));
  if (!zeros || zeros->size() < need)
    zeros = std::make_shared<const std::vector<float>>(
        std::max(need, zeros ? 2 * zeros->size() : std::size_t{0}), 0.0f);
  return zeros;
}

void Shared::count_sent(int from, int to, std::int64_t elements) {
  const int t = topology.tier(from, to);
  if (t < 0 || elements <= 0) return;
  sent_bytes_by_tier[static_cast<size_t>(t)] += elements * static_cast<std::int64_t>(sizeof(float));
}

namespace {
constexpr int kPingTag = 1;  // "are you still making MPI calls?"
constexpr int kPongTag = 2;  // "yes"
}  // namespace

Shared::~Shared() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // A send to a rank that is gone may never complete: its buffer is left to MPI.
  for (PendingSend& p : pending_sends) {
    MPI_Request_free(&p.request);
    (void)p.payload.release();
  }
  if (watchdog != MPI_COMM_NULL) MPI_Comm_free(&watchdog);
}

double Shared::bound_s(double wait_start_s) const {
  if (!progress_auto) return progress_timeout_s;
  // A peer doing the same work as this rank takes about as long as this rank took to reach the
  // wait; a generous multiple of that, or of the longest step, is never an honest delay. Before
  // the first step (weights loading on every rank) the floor is four times higher.
  const double floor_s = in_steps ? progress_floor_s : 4 * progress_floor_s;
  return std::max({floor_s, progress_multiple * longest_step_s,
                   progress_multiple * (wait_start_s - phase_start_s)});
}

void Shared::step_started() {
  const double now = MPI_Wtime();
  if (in_steps) longest_step_s = std::max(longest_step_s, now - phase_start_s);
  in_steps = true;
  phase_start_s = now;
}

int Shared::wait(MPI_Request* request, MPI_Status* status, const std::function<std::string()>& what,
                 int peer_world) {
  if (!watchdog_on()) return MPI_Wait(request, status);
  const double start = MPI_Wtime();
  const double bound = bound_s(start);
  double since = start;  // the last time progress was seen
  for (;;) {
    int flag = 0;
    const int rc = MPI_Test(request, &flag, status);
    if (rc != MPI_SUCCESS || flag) {
      ++completed_waits;
      return rc;
    }
    answer_pings();
    const double now = MPI_Wtime();
    if (now - since > bound) {
      probe(what(), peer_world, now - start, bound);  // throws unless progress was seen
      since = MPI_Wtime();
    }
    std::this_thread::yield();
  }
}

void Shared::send_pair(std::int64_t a, std::int64_t b, int dest, int tag) {
  // Drop the buffers of sends that completed; a send to a stopped rank may stay pending.
  std::erase_if(pending_sends, [](PendingSend& p) {
    int done = 0;
    return MPI_Test(&p.request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done != 0;
  });
  PendingSend p;
  p.payload = std::make_unique<std::int64_t[]>(2);
  p.payload[0] = a;
  p.payload[1] = b;
  if (MPI_Isend(p.payload.get(), 2, MPI_INT64_T, dest, tag, watchdog, &p.request) == MPI_SUCCESS)
    pending_sends.push_back(std::move(p));
}

void Shared::answer_pings() {
  if (watchdog == MPI_COMM_NULL) return;
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kPingTag, watchdog, &flag, &st) != MPI_SUCCESS || !flag) return;
    std::int64_t ping[2] = {0, 0};  // the asker's probe number, its rank
    MPI_Recv(ping, 2, MPI_INT64_T, st.MPI_SOURCE, kPingTag, watchdog, MPI_STATUS_IGNORE);
    send_pair(ping[0], completed_waits, st.MPI_SOURCE, kPongTag);  // "yes, and my progress"
  }
}

std::string Shared::bound_note(double bound) const {
  char text[640];
  if (!progress_auto) {
    std::snprintf(text, sizeof text, " (mpi.progress_timeout_s = %g)", progress_timeout_s);
  } else {
    std::snprintf(text, sizeof text,
                  " (mpi.progress_timeout_s = \"auto\": %.1f s, the largest of the floor %g s%s, "
                  "%g x the longest step so far and %g x this rank's time in the current %s "
                  "before the wait; --progress-timeout S sets it, 0 turns it off)",
                  bound, in_steps ? progress_floor_s : 4 * progress_floor_s,
                  in_steps ? "" : " (x 4 before the first step)", progress_multiple,
                  progress_multiple, in_steps ? "step" : "setup");
  }
  return text;
}

void Shared::probe(const std::string& what, int peer_world, double waited_s, double bound) {
  // Ask every other rank whether it still makes MPI calls: a rank waiting too answers within
  // milliseconds, with the number of waits it completed; one that stopped (or computes outside
  // MPI for longer than the grace) does not. Answers to an earlier probe are told apart by
  // their probe number and dropped.
  const std::int64_t seq = ++probe_seq;
  for (int r = 0; r < world_size; ++r)
    if (r != world_rank) send_pair(seq, world_rank, r, kPingTag);
  std::vector<char> answered(static_cast<size_t>(world_size), 0);
  std::vector<std::int64_t> counts(static_cast<size_t>(world_size), 0);
  answered[static_cast<size_t>(world_rank)] = 1;
  counts[static_cast<size_t>(world_rank)] = completed_waits;
  int missing = world_size - 1;
  const double grace_s = std::clamp(bound, 0.5, 1.0);
  const double t0 = MPI_Wtime();
  while (missing > 0 && MPI_Wtime() - t0 < grace_s) {
    answer_pings();
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kPongTag, watchdog, &flag, &st) == MPI_SUCCESS && flag) {
      std::int64_t pong[2] = {0, 0};  // the probe number, the answering rank's completed waits
      MPI_Recv(pong, 2, MPI_INT64_T, st.MPI_SOURCE, kPongTag, watchdog, MPI_STATUS_IGNORE);
      if (pong[0] != seq) continue;
      const auto from = static_cast<size_t>(st.MPI_SOURCE);
      if (answered[from] == 0) --missing;
      answered[from] = 1;
      counts[from] = pong[1];
    } else {
      std::this_thread::yield();
    }
  }
  std::string silent;
  for (int r = 0; r < world_size; ++r)
    if (answered[static_cast<size_t>(r)] == 0)
      silent += (silent.empty() ? "" : ", ") + std::to_string(r);
  if (silent.empty()) {
    // Every rank is alive. Some completed waits since the last probe: the job moves, only
    // slowly (a peer computed long and happened to be in an MPI call when asked); wait on.
    const bool moved = counts != last_counts;
    last_counts = std::move(counts);
    if (moved) return;
  }
  char head[96];
  std::snprintf(head, sizeof head, "no progress for %.1f s waiting in ", waited_s);
  std::string msg = head + what;
  if (peer_world >= 0) msg += " (peer: world rank " + std::to_string(peer_world) + ")";
  char grace[48];
  std::snprintf(grace, sizeof grace, "%.1f s", grace_s);
  msg += silent.empty()
             ? "; every other rank still makes MPI calls but none completed a wait since the "
               "previous check (they wait on each other: mismatched communication?)"
             : "; stopped rank(s): " + silent + " (no answer within " + grace +
                   "; the other ranks still make MPI calls)";
  throw CommError(msg + bound_note(bound));
}

void check_mpi(int rc, std::string_view where) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "?");
  int cls = rc;
  MPI_Error_class(rc, &cls);
  throw CommError(std::string(where) +
                  ": MPI error: " + std::string(text, static_cast<size_t>(len)) +
                  " (MPI error class " + std::to_string(cls) + ")");
}

int to_mpi_int(std::int64_t value, std::string_view what, std::string_view where) {
  if (value < 0 || value > INT_MAX)
    throw CommError(std::string(where) + ": " + std::string(what) + " is " + std::to_string(value) +
                    ", outside MPI's int range [0, " + std::to_string(INT_MAX) +
                    "]; split the transfer into smaller ones");
  return static_cast<int>(value);
}

std::string placement_error(const Topology& topo, std::span<const int> host_id,
                            std::span<const std::string> host_name) {
  const std::string hint = ". Check the hostfile and the mapping (e.g. mpirun --map-by ppr:" +
                           std::to_string(topo.ranks_per_node()) + ":node for " +
                           std::to_string(topo.ranks_per_node()) + " ranks per node)";
  std::map<int, int> first_on_host;  // host id -> first world rank on that host
  std::map<int, int> first_in_node;  // topology node -> first world rank of that node
  for (int r = 0; r < topo.num_ranks(); ++r) {
    const auto ur = static_cast<size_t>(r);
    const auto [h, new_host] = first_on_host.emplace(host_id[ur], r);
    if (!new_host && topo.node(h->second) != topo.node(r))
      return topo.describe_rank(h->second) + " and " + topo.describe_rank(r) +
             " are on different nodes of the topology but run on the same host '" + host_name[ur] +
             "'" + hint;
    const auto [n, new_node] = first_in_node.emplace(topo.node(r), r);
    if (!new_node && host_id[static_cast<size_t>(n->second)] != host_id[ur])
      return topo.describe_rank(n->second) + " and " + topo.describe_rank(r) +
             " are on one node of the topology but run on different hosts '" +
             host_name[static_cast<size_t>(n->second)] + "' and '" + host_name[ur] + "'" + hint;
  }
  return {};
}

}  // namespace detail

namespace {

// "send 'label' to rank 3 on rank 1 of 4 (world rank 5)": the prefix of every error message.
std::string describe(std::string_view op, std::string_view label, int peer, int rank, int size,
                     int world_rank) {
  std::string s(op);
  if (!label.empty()) s += " '" + std::string(label) + "'";
  if (peer >= 0) s += (op == "recv" ? " from rank " : " to rank ") + std::to_string(peer);
  return s + " on rank " + std::to_string(rank) + " of " + std::to_string(size) + " (world rank " +
         std::to_string(world_rank) + ")";
}

// `value` as an MPI int; builds the error message only when it does not fit.
template <typename Where>
int mpi_int(std::int64_t value, const char* what, const Where& where) {
  if (value >= 0 && value <= INT_MAX) return static_cast<int>(value);
  return detail::to_mpi_int(value, what, where());  // throws
}

std::string describe_levels(const Topology& topo) {
  std::string s;
  for (const TopologyLevel& l : topo.levels()) {
    if (!s.empty()) s += " x ";
    s += std::to_string(l.size) + " " + l.name;
  }
  return s;
}

bool overlaps(const float* a, std::size_t na, const float* b, std::size_t nb) {
  if (na == 0 || nb == 0) return false;
  std::less<const float*> lt;
  return lt(a, b + nb) && lt(b, a + na);
}

// One MPI request and everything the call needs until it completes: int count arrays,
// scratch buffers for phantom sides, copies of send data that aliases the receive buffer.
class MpiRequest final : public RequestImpl {
 public:
  /// `op` is a string literal; the description is only built when an error needs it.
  MpiRequest(const char* op, std::string_view label, int peer, const MpiComm& comm,
             std::shared_ptr<detail::Shared> accounting)
      : op_(op),
        label_(label),
        peer_(peer),
        rank_(comm.rank()),
        size_(comm.size()),
        world_rank_(comm.world_rank(comm.rank())),
        peer_world_(peer >= 0 ? comm.world_rank(peer) : -1),
        accounting_(std::move(accounting)) {}
  ~MpiRequest() override;

  void wait() override {
    if (done_) return;
    MPI_Status status;
    const double t0 = MPI_Wtime();
    const int rc = accounting_->wait(
        &req_, &status, [this] { return where(); }, peer_world_);
    accounting_->comm_wait_s += MPI_Wtime() - t0;
    finish(rc, status);
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_Status status;
    const int rc = MPI_Test(&req_, &flag, &status);
    if (rc == MPI_SUCCESS && !flag) return false;
    finish(rc, status);
    return true;
  }

  MPI_Request* handle() { return &req_; }
  std::string where() const { return describe(op_, label_, peer_, rank_, size_, world_rank_); }
  /// A receive checks the element count that arrived (MPI accepts shorter messages).
  void expect_count(int count) { expect_count_ = count; }

  // Keep-alive storage, released on completion.
  std::vector<int> ints;
  std::shared_ptr<const std::vector<float>> zeros;
  std::unique_ptr<float[]> scratch;

 private:
  void finish(int rc, const MPI_Status& status) {
    done_ = true;
    release();
    if (rc != MPI_SUCCESS) detail::check_mpi(rc, where());
    if (expect_count_ >= 0) {
      int got = 0;
      MPI_Get_count(&status, MPI_FLOAT, &got);
      if (got != expect_count_)
        throw CommError(where() + ": received " + std::to_string(got) + " elements from rank " +
                        std::to_string(status.MPI_SOURCE) + ", expected " +
                        std::to_string(expect_count_));
    }
  }
  void release() {
    ints = {};
    zeros.reset();
    scratch.reset();
  }

  MPI_Request req_ = MPI_REQUEST_NULL;
  const char* op_;
  std::string label_;
  int peer_, rank_, size_, world_rank_, peer_world_;
  int expect_count_ = -1;
  bool done_ = false;
  std::shared_ptr<detail::Shared> accounting_;
};

MpiRequest::~MpiRequest() {
  if (done_ || req_ == MPI_REQUEST_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (std::uncaught_exceptions() > 0) {
    // Unwinding towards an abort: waiting could hang on a peer that never comes, and freeing
    // buffers MPI may still write is worse, so the buffers are deliberately leaked.
    new std::vector<int>(std::move(ints));
    new std::shared_ptr<const std::vector<float>>(std::move(zeros));
    (void)scratch.release();
    return;
  }
  // A request dropped without wait() is still completed, as MPI requires.
  MPI_Wait(&req_, MPI_STATUS_IGNORE);
}

void post(int rc, const MpiRequest& req) {
  if (rc != MPI_SUCCESS) detail::check_mpi(rc, req.where());
}

void check_tag(int tag, int tag_ub, const MpiRequest& req) {
  if (tag < 0 || tag > tag_ub)
    throw CommError(req.where() + ": tag " + std::to_string(tag) + " outside MPI's range [0, " +
                    std::to_string(tag_ub) + "]");
}
}  // namespace

int exit_code_for(const std::exception& e) {
  if (const auto* re = dynamic_cast<const RankError*>(&e)) return re->user_error() ? 2 : 1;
  return dynamic_cast<const UserError*>(&e) ? 2 : 1;
}

// ---------------------------------------------------------------------------------------------
// MpiRuntime

MpiRuntime::MpiRuntime(int& argc, char**& argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) throw CommError("MPI is already initialised: create one MpiRuntime per process");
  int provided = MPI_THREAD_SINGLE;
  const int rc = MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS)
    throw CommError("MPI_Init_thread failed with error code " + std::to_string(rc));
  // The DiT code calls MPI from one thread only, so SINGLE is enough if that is all we get.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  start_wtime_s_ = MPI_Wtime();
  uncaught_at_start_ = std::uncaught_exceptions();
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (std::uncaught_exceptions() > uncaught_at_start_)
    abort("an exception is propagating past MpiRuntime (wrap the run in run_guarded() to see it)",
          1);
  MPI_Finalize();
}

SimTime MpiRuntime::elapsed() const {
  return SimTime::from_ns(std::llround((MPI_Wtime() - start_wtime_s_) * 1e9));
}

void MpiRuntime::abort(std::string_view message, int exit_code) const {
  std::fprintf(stderr, "cocodiff: rank %d: %.*s\n", world_rank_, static_cast<int>(message.size()),
               message.data());
  std::fflush(stderr);
  if (before_abort_) before_abort_();
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();  // MPI_Abort does not return; this is for a broken MPI
}

int MpiRuntime::run_guarded(const std::function<int()>& body) const {
  try {
    return body();
  } catch (const std::exception& e) {
    abort(e.what(), exit_code_for(e));
  } catch (...) {
    abort("unknown exception", 1);
  }
}

int MpiRuntime::lowest_failed_rank(bool failed) const {
  int first = failed ? world_rank_ : world_size_;
  // MPI_COMM_WORLD aborts on errors by default: a broken job ends here rather than hangs.
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return first < world_size_ ? first : -1;
}

void MpiRuntime::abort_quietly(int exit_code) const {
  std::this_thread::sleep_for(std::chrono::seconds(5));  // the reporting rank aborts first
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();
}

void MpiRuntime::check_size(const Topology& topo) const {
  // Every rank sees the same sizes, so every rank throws alike, before any collective.
  if (topo.num_ranks() != world_size_)
    throw CommError("the MPI job has " + std::to_string(world_size_) + " ranks but the topology (" +
                    describe_levels(topo) + ") has " + std::to_string(topo.num_ranks()) +
                    "; start it with mpirun -np " + std::to_string(topo.num_ranks()));
}

std::unique_ptr<Communicator> MpiRuntime::world(const Topology& topo, WorldOptions options) const {
  check_size(topo);

  const std::string where = "world() on rank " + std::to_string(world_rank_);
  MPI_Comm dup = MPI_COMM_NULL;
  detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &dup), where + ": MPI_Comm_dup");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  auto shared = std::make_shared<detail::Shared>();
  shared->topology = topo;
  shared->sent_bytes_by_tier.assign(static_cast<size_t>(topo.num_tiers()), 0);
  shared->start_wtime_s = start_wtime_s_;
  shared->world_rank = world_rank_;
  shared->world_size = world_size_;
  shared->progress_timeout_s = options.progress_timeout_s;
  shared->progress_auto = options.progress_auto;
  shared->progress_floor_s = options.progress_floor_s;
  shared->progress_multiple = options.progress_multiple;
  shared->phase_start_s = MPI_Wtime();
  if (shared->watchdog_on()) {
    detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &shared->watchdog),
                      where + ": MPI_Comm_dup (watchdog)");
    MPI_Comm_set_errhandler(shared->watchdog, MPI_ERRORS_RETURN);
  }
  int* tag_ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
  if (flag && tag_ub) shared->tag_ub = *tag_ub;
  auto comm = std::make_unique<MpiComm>(std::move(shared), dup);  // owns dup from here on

  if (options.check_hosts) {
    // A host is the set of ranks MPI_COMM_TYPE_SHARED groups; its id is its lowest world rank.
    MPI_Comm host = MPI_COMM_NULL;
    detail::check_mpi(MPI_Comm_split_type(dup, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host),
                      where + ": MPI_Comm_split_type");
    int host_id = world_rank_;
    const int rc = MPI_Allreduce(MPI_IN_PLACE, &host_id, 1, MPI_INT, MPI_MIN, host);
    MPI_Comm_free(&host);
    detail::check_mpi(rc, where + ": host id");
    std::vector<int> ids(static_cast<size_t>(world_size_));
    detail::check_mpi(MPI_Allgather(&host_id, 1, MPI_INT, ids.data(), 1, MPI_INT, dup),
                      where + ": gathering host ids");
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    std::vector<char> names(static_cast<size_t>(world_size_) * MPI_MAX_PROCESSOR_NAME);
    detail::check_mpi(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                                    MPI_MAX_PROCESSOR_NAME, MPI_CHAR, dup),
                      where + ": gathering host names");
    std::vector<std::string> host_names;
    host_names.reserve(static_cast<size_t>(world_size_));
    for (int r = 0; r < world_size_; ++r)
      host_names.emplace_back(names.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
    const std::string err = detail::placement_error(topo, ids, host_names);
    if (!err.empty()) throw CommError("host placement does not match the topology: " + err);
  }
  return comm;
}

// ---------------------------------------------------------------------------------------------
// MpiComm

MpiComm::MpiComm(std::shared_ptr<detail::Shared> shared, MPI_Comm comm)
    : shared_(std::move(shared)), comm_(comm) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm_, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  std::vector<int> ranks(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i) ranks[static_cast<size_t>(i)] = i;
  members_.resize(static_cast<size_t>(size_));
  MPI_Group_translate_ranks(mine, size_, ranks.data(), world, members_.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // MPI_Comm_free is local and lets pending operations finish.
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

const Topology& MpiComm::topology() const { return shared_->topology; }

int MpiComm::world_rank(int group_rank) const {
  COCO_CHECK(group_rank >= 0 && group_rank < size_, "group rank out of range");
  return members_[static_cast<size_t>(group_rank)];
}

SimTime MpiComm::now() const {
  return SimTime::from_ns(std::llround((MPI_Wtime() - shared_->start_wtime_s) * 1e9));
}

std::string MpiComm::where(std::string_view op, std::string_view label) const {
  return describe(op, label, -1, rank_, size_, members_[static_cast<size_t>(rank_)]);
}

std::unique_ptr<Communicator> MpiComm::split(int color, int key) {
  const std::string w = where("split", {});
  // MPI wants colors >= 0; renumber the colors in use densely, in increasing order.
  int mine[2] = {color, key};
  std::vector<int> all(static_cast<size_t>(2 * size_));
  detail::check_mpi(MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm_), w);
  std::vector<int> colors;
  colors.reserve(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) colors.push_back(all[2 * static_cast<size_t>(r)]);
  std::sort(colors.begin(), colors.end());
  colors.erase(std::unique(colors.begin(), colors.end()), colors.end());
  const int dense =
      static_cast<int>(std::lower_bound(colors.begin(), colors.end(), color) - colors.begin());
  MPI_Comm sub = MPI_COMM_NULL;
  detail::check_mpi(MPI_Comm_split(comm_, dense, key, &sub), w);
  return std::make_unique<MpiComm>(shared_, sub);
}

void MpiComm::barrier() {
  const double t0 = MPI_Wtime();
  int rc = MPI_SUCCESS;
  if (shared_->watchdog_on()) {  // non-blocking, so that the watchdog can look at it
    MPI_Request r = MPI_REQUEST_NULL;
    rc = MPI_Ibarrier(comm_, &r);
    if (rc == MPI_SUCCESS)
      rc = shared_->wait(
          &r, MPI_STATUS_IGNORE, [this] { return where("barrier", {}); }, -1);
  } else {
    rc = MPI_Barrier(comm_);
  }
  shared_->comm_wait_s += MPI_Wtime() - t0;
  detail::check_mpi(rc, where("barrier", {}));
}

void MpiComm::count_to_all(std::int64_t elements_each) const {
  for (int j = 0; j < size_; ++j)
    if (j != rank_)
      shared_->count_sent(members_[static_cast<size_t>(rank_)], members_[static_cast<size_t>(j)],
                          elements_each);
}

void MpiComm::step_started() const { shared_->step_started(); }

Accounting MpiComm::accounting() const {
  Accounting a;
  a.comm_wait_s = shared_->comm_wait_s;
  a.sent_bytes_by_tier = shared_->sent_bytes_by_tier;
  return a;
}

Request MpiComm::do_iall_to_all(std::span<const float> send, std::span<float> recv,
                                std::int64_t count, std::string_view label) {
  auto req = std::make_shared<MpiRequest>("all_to_all", label, -1, *this, shared_);
  const int n = mpi_int(count, "the count per rank", [&] { return req->where(); });
  const std::int64_t total = count * size_;
  const float* sp = send.data();
  float* rp = recv.data();
  if (send.empty() && total > 0) {
    req->zeros = shared_->zeros_of(total);
    sp = req->zeros->data();
  } else if (overlaps(send.data(), send.size(), recv.data(), recv.size())) {
    req->scratch = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(total));
    std::copy_n(send.data(), total, req->scratch.get());
    sp = req->scratch.get();
  }
  if (recv.empty() && total > 0) {
    // Phantom receive (never together with the copy above: an empty span overlaps nothing).
    req->scratch = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(total));
    rp = req->scratch.get();
  }
  count_to_all(count);
  post(MPI_Ialltoall(sp, n, MPI_FLOAT, rp, n, MPI_FLOAT, comm_, req->handle()), *req);
  return Request(std::move(req));
}

Request MpiComm::do_iall_to_allv(std::span<const float> send, std::span<float> recv,
                                 const AllToAllvLayout& layout, std::string_view label) {
  auto req = std::make_shared<MpiRequest>("all_to_allv", label, -1, *this, shared_);
  const auto p = static_cast<size_t>(size_);
  req->ints.resize(4 * p);
  int* sc = req->ints.data();
  int* sd = sc + p;
  int* rc = sd + p;
  int* rd = rc + p;
  auto convert = [&](const std::vector<std::int64_t>& from, int* to, const char* what) {
    for (size_t i = 0; i < p; ++i)
      to[i] = mpi_int(from[i], what,
                      [&] { return req->where() + " (rank " + std::to_string(i) + ")"; });
  };
  convert(layout.send_counts, sc, "the send count");
  convert(layout.send_displs, sd, "the send displacement");
  convert(layout.recv_counts, rc, "the receive count");
  convert(layout.recv_displs, rd, "the receive displacement");
  const std::int64_t send_total = layout.send_total(), recv_total = layout.recv_total();
  const float* sp = send.data();
  float* rp = recv.data();
  if (send.empty() && send_total > 0) {
    req->zeros = shared_->zeros_of(send_total);
    sp = req->zeros->data();
  } else if (overlaps(send.data(), send.size(), recv.data(), recv.size())) {
    req->scratch = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(send_total));
    std::copy_n(send.data(), send_total, req->scratch.get());
    sp = req->scratch.get();
  }
  if (recv.empty() && recv_total > 0) {
    req->scratch = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(recv_total));
    rp = req->scratch.get();
  }
  for (int j = 0; j < size_; ++j)
    if (j != rank_)
      shared_->count_sent(members_[static_cast<size_t>(rank_)], members_[static_cast<size_t>(j)],
                          layout.send_counts[static_cast<size_t>(j)]);
  post(MPI_Ialltoallv(sp, sc, sd, MPI_FLOAT, rp, rc, rd, MPI_FLOAT, comm_, req->handle()), *req);
  return Request(std::move(req));
}

Request MpiComm::do_iall_gather(std::span<const float> send, std::span<float> recv,
                                std::int64_t count, std::string_view label) {
  auto req = std::make_shared<MpiRequest>("all_gather", label, -1, *this, shared_);
  const int n = mpi_int(count, "the count per rank", [&] { return req->where(); });
  const std::int64_t total = count * size_;
  const void* sp = send.data();
  float* rp = recv.data();
  if (send.empty() && count > 0) {
    req->zeros = shared_->zeros_of(count);
    sp = req->zeros->data();
  } else if (recv.size() > 0 && send.data() == recv.data() + count * rank_) {
    sp = MPI_IN_PLACE;  // the caller's block already sits where it belongs
  } else if (overlaps(send.data(), send.size(), recv.data(), recv.size())) {
    req->scratch = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(count));
    std::copy_n(send.data(), count, req->scratch.get());
    sp = req->scratch.get();
  }
  if (recv.empty() && total > 0) {
    req->scratch = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(total));
    rp = req->scratch.get();
  }
  count_to_all(count);
  post(MPI_Iallgather(sp, n, MPI_FLOAT, rp, n, MPI_FLOAT, comm_, req->handle()), *req);
  return Request(std::move(req));
}

Request MpiComm::do_iall_reduce(std::span<float> data, std::int64_t count, ReduceOp op,
                                std::string_view label) {
  auto req = std::make_shared<MpiRequest>(
      op == ReduceOp::kSum ? "all_reduce(sum)" : "all_reduce(max)", label, -1, *this, shared_);
  const int n = mpi_int(count, "the count", [&] { return req->where(); });
  float* p = data.data();
  if (data.empty() && count > 0) {
    req->scratch = std::make_unique<float[]>(static_cast<size_t>(count));  // zeros: no NaNs
    p = req->scratch.get();
  }
  post(MPI_Iallreduce(MPI_IN_PLACE, p, n, MPI_FLOAT, op == ReduceOp::kSum ? MPI_SUM : MPI_MAX,
                      comm_, req->handle()),
       *req);
  return Request(std::move(req));
}

Request MpiComm::do_isend(std::span<const float> data, std::int64_t count, int dest, int tag,
                          std::string_view label) {
  auto req = std::make_shared<MpiRequest>("send", label, dest, *this, shared_);
  check_tag(tag, shared_->tag_ub, *req);
  const int n = mpi_int(count, "the count", [&] { return req->where(); });
  const float* p = data.data();
  if (data.empty() && count > 0) {
    req->zeros = shared_->zeros_of(count);
    p = req->zeros->data();
  }
  if (dest != rank_)
    shared_->count_sent(members_[static_cast<size_t>(rank_)], members_[static_cast<size_t>(dest)],
                        count);
  post(MPI_Isend(p, n, MPI_FLOAT, dest, tag, comm_, req->handle()), *req);
  return Request(std::move(req));
}

Request MpiComm::do_irecv(std::span<float> data, std::int64_t count, int source, int tag,
                          std::string_view label) {
  auto req = std::make_shared<MpiRequest>("recv", label, source, *this, shared_);
  check_tag(tag, shared_->tag_ub, *req);
  const int n = mpi_int(count, "the count", [&] { return req->where(); });
  float* p = data.data();
  if (data.empty() && count > 0) {
    req->scratch = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(count));
    p = req->scratch.get();
  }
  req->expect_count(n);
  post(MPI_Irecv(p, n, MPI_FLOAT, source, tag, comm_, req->handle()), *req);
  return Request(std::move(req));
}

}  // namespace cocodiff::mpi
