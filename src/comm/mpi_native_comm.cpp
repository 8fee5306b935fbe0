// The "mpi-native" communicator (src/comm/mpi_comm.hpp): MPI's own collectives (MPI_Allreduce,
// MPI_Bcast, MPI_Allgather, MPI_Barrier), the baseline rows of `dpcheck bench allreduce` against which
// the "mpi" backend's fixed-order collectives are timed. It neither times out nor checks that the ranks'
// calls agree. Built only with MPI (src/comm/mpi_stub.cpp stands in without it).
#include "src/comm/mpi_comm.hpp"

#include <limits>
#include <span>
#include <string>

#include "src/comm/mpi_world.hpp"
#include "src/error.hpp"

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
  }
  throw_call_error("mpi_type", static_cast<long>(t), "not a dtype", __FILE__, __LINE__);
}

int mpi_count(std::size_t count, std::string_view call) {
  if (count > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw Error(std::string(call) + ": count " + std::to_string(count) + " is more than MPI's int counts hold");
  return static_cast<int>(count);
}

class MpiNativeComm final : public Communicator {
 public:
  explicit MpiNativeComm(MPI_Comm comm) : comm_(comm) {
    DPCHECK_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    DPCHECK_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    DPCHECK_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiNativeComm() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  MpiNativeComm(const MpiNativeComm&) = delete;
  MpiNativeComm& operator=(const MpiNativeComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi-native"; }

  void allreduce(void* buf, std::size_t count, DType dtype, ReduceOp op) override {
    if (dtype == DType::u8) throw Error("allreduce does not support uint8");
    const bool is_float = dtype == DType::f32 || dtype == DType::f64;
    if (op == ReduceOp::avg && !is_float)
      throw Error("avg is for float32 and float64, not " + std::string(dtype_name(dtype)));
    const MPI_Op mop = op == ReduceOp::min ? MPI_MIN : op == ReduceOp::max ? MPI_MAX : MPI_SUM;
    DPCHECK_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, mpi_count(count, "allreduce"), mpi_type(dtype), mop, comm_));
    if (op == ReduceOp::avg) {
      if (dtype == DType::f32)
        for (float& v : std::span(static_cast<float*>(buf), count)) v /= static_cast<float>(size_);
      else
        for (double& v : std::span(static_cast<double*>(buf), count)) v /= static_cast<double>(size_);
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
    DPCHECK_MPI_CHECK(MPI_Allgather(send == own ? MPI_IN_PLACE : send, n, mpi_type(dtype), recv, n,
                                    mpi_type(dtype), comm_));
  }

  void barrier() override { DPCHECK_MPI_CHECK(MPI_Barrier(comm_)); }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_native_communicator() {
  return make_on_world_duplicate<MpiNativeComm>("make_mpi_native_communicator");
}

}  // namespace dpcheck
