// The "mpi-native" communicator (src/comm/mpi_comm.hpp): MPI's own collectives (MPI_Allreduce,
// MPI_Bcast, MPI_Allgather, MPI_Barrier), the baseline rows of `dpcheck bench allreduce` against which
// the "mpi" backend's fixed-order collectives are timed. It neither times out nor checks that the ranks'
// calls agree. Built only with MPI (src/comm/mpi_stub.cpp stands in without it).
//
// MPI has no bfloat16 or float16 type: those all-reduce as MPI_UINT16_T under user-defined operations
// that widen both operands to float32, combine them and round the result back, so the traffic stays
// 16-bit, as a framework's bf16 all-reduce over MPI would be; MPI's tree then rounds at every
// combination (src/comm.hpp), and avg divides that sum by N and rounds once more.
#include "src/builtin_names.hpp"
#include "src/comm/mpi_comm.hpp"

#include <cstdint>
#include <limits>
#include <span>
#include <string>

#include "src/comm/mpi_world.hpp"
#include "src/error.hpp"
#include "src/low_precision.hpp"

namespace dpcheck {

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u64: return MPI_UINT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::bf16: return MPI_UINT16_T;  // the patterns; reductions use the operations below
    case DType::f16: return MPI_UINT16_T;
  }
  throw_call_error("mpi_type", static_cast<long>(t), "not a dtype", __FILE__, __LINE__);
}

int mpi_count(std::size_t count, std::string_view call) {
  if (count > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw Error(std::string(call) + ": count " + std::to_string(count) + " is more than MPI's int counts hold");
  return static_cast<int>(count);
}

template <DType T> float widen(std::uint16_t h) {
  return T == DType::bf16 ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
}
template <DType T> std::uint16_t narrow(float f) {
  return T == DType::bf16 ? float_to_bf16_bits(f) : float_to_fp16_bits(f);
}

// An MPI_User_function: inout[i] = in[i] (op) inout[i], in float32, rounded to the format.
template <DType T, ReduceOp Op> void combine_16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = widen<T>(a[i]), y = widen<T>(b[i]);
    b[i] = narrow<T>(Op == ReduceOp::min ? (y < x ? y : x) : Op == ReduceOp::max ? (x < y ? y : x) : x + y);
  }
}

class MpiNativeComm final : public Communicator {
 public:
  explicit MpiNativeComm(MPI_Comm comm) : comm_(comm) {
    DPCHECK_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    DPCHECK_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    DPCHECK_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    // Commutative (1): the operands' order changes no single combination's rounding.
    DPCHECK_MPI_CHECK(MPI_Op_create(&combine_16<DType::bf16, ReduceOp::sum>, 1, &ops_[0][0]));
    DPCHECK_MPI_CHECK(MPI_Op_create(&combine_16<DType::bf16, ReduceOp::min>, 1, &ops_[0][1]));
    DPCHECK_MPI_CHECK(MPI_Op_create(&combine_16<DType::bf16, ReduceOp::max>, 1, &ops_[0][2]));
    DPCHECK_MPI_CHECK(MPI_Op_create(&combine_16<DType::f16, ReduceOp::sum>, 1, &ops_[1][0]));
    DPCHECK_MPI_CHECK(MPI_Op_create(&combine_16<DType::f16, ReduceOp::min>, 1, &ops_[1][1]));
    DPCHECK_MPI_CHECK(MPI_Op_create(&combine_16<DType::f16, ReduceOp::max>, 1, &ops_[1][2]));
  }
  ~MpiNativeComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& format : ops_)
      for (MPI_Op& op : format)
        if (op != MPI_OP_NULL) MPI_Op_free(&op);
    MPI_Comm_free(&comm_);
  }
  MpiNativeComm(const MpiNativeComm&) = delete;
  MpiNativeComm& operator=(const MpiNativeComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool callable_from_any_thread() const override { return mpi_calls_from_any_thread(); }
  std::string_view backend() const override { return builtin::mpi_native; }
  // dpcheck's own control messages (replica hashes, verdicts) go over `host` when one was given: the
  // "mpi" communicator, which times out where MPI's own calls would wait forever.
  Communicator& host() override { return host_ ? *host_ : *this; }
  void set_host(Communicator* host) { host_ = host; }

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    if (dtype == DType::u8) throw Error("allreduce does not support uint8");
    if (op == ReduceOp::avg && !is_floating(dtype) && dtype != DType::i64)
      throw Error("avg is for the floating dtypes and int64, not " + std::string(dtype_name(dtype)));
    const int which = op == ReduceOp::min ? 1 : op == ReduceOp::max ? 2 : 0;  // avg: the sum, divided below
    MPI_Op mop = op == ReduceOp::min ? MPI_MIN : op == ReduceOp::max ? MPI_MAX : MPI_SUM;
    if (is_16bit_float(dtype)) mop = ops_[dtype == DType::bf16 ? 0 : 1][which];
    DPCHECK_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, mpi_count(count, "allreduce"), mpi_type(dtype), mop, comm_));
    if (op != ReduceOp::avg) return;
    const auto n = static_cast<float>(size_);
    switch (dtype) {
      case DType::f32:
        for (float& v : std::span(static_cast<float*>(buf), count)) v /= n;
        return;
      case DType::f64:
        for (double& v : std::span(static_cast<double*>(buf), count)) v /= static_cast<double>(size_);
        return;
      case DType::bf16:
        for (std::uint16_t& v : std::span(static_cast<std::uint16_t*>(buf), count))
          v = narrow<DType::bf16>(widen<DType::bf16>(v) / n);
        return;
      case DType::f16:
        for (std::uint16_t& v : std::span(static_cast<std::uint16_t*>(buf), count))
          v = narrow<DType::f16>(widen<DType::f16>(v) / n);
        return;
      case DType::i64:  // as a plugin's int64 avg: the sum divided by N, toward zero
        for (std::int64_t& v : std::span(static_cast<std::int64_t*>(buf), count)) v /= size_;
        return;
      default: DPCHECK_ASSERT(false);  // refused above
    }
  }

  void broadcast(void* buf, std::size_t count, DType dtype, int root) override {
    if (root < 0 || root >= size_)
      throw Error("broadcast root " + std::to_string(root) + " is not a rank of a world of size " +
                  std::to_string(size_));
    DPCHECK_MPI_CHECK(MPI_Bcast(buf, mpi_count(count, "broadcast"), mpi_type(dtype), root, comm_));
  }

  void allgather(const void* send, void* recv, std::size_t count, DType dtype) override {
    const int n = mpi_count(count, "allgather");
    const void* own = static_cast<unsigned char*>(recv) + static_cast<std::size_t>(rank_) * count * dtype_size(dtype);
    DPCHECK_MPI_CHECK(
        MPI_Allgather(send == own ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv, n, mpi_type(dtype), comm_));
  }

  void barrier() override { DPCHECK_MPI_CHECK(MPI_Barrier(comm_)); }

 private:
  MPI_Comm comm_;
  Communicator* host_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  // The 16-bit formats' operations: [bfloat16, float16][sum, min, max].
  MPI_Op ops_[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_native_communicator(Communicator* host) {
  std::unique_ptr<Communicator> comm = make_on_world_duplicate<MpiNativeComm>("make_mpi_native_communicator");
  static_cast<MpiNativeComm&>(*comm).set_host(host);
  return comm;
}

}  // namespace dpcheck
