#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <sys/uio.h>

/* shim.c */
int evb_fi_close(struct fid *fid);
int evb_fi_control(struct fid *fid, int command, void *arg);
int evb_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain, void *context);
int evb_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context);
int evb_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context);
int evb_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context);
int evb_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access,
                  uint64_t offset, uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context);
void *evb_fi_mr_desc(struct fid_mr *mr);
int evb_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int evb_fi_enable(struct fid_ep *ep);
int evb_fi_getname(struct fid *fid, void *addr, size_t *addrlen);
ssize_t evb_fi_cancel(struct fid *fid, void *context);
int evb_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *context);
ssize_t evb_fi_tsendv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count,
                      fi_addr_t dest_addr, uint64_t tag, void *context);
ssize_t evb_fi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr,
                     uint64_t tag, uint64_t ignore, void *context);
ssize_t evb_fi_tdiscard(struct fid_ep *ep, uint64_t tag, uint64_t ignore, void *context);
ssize_t evb_fi_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t evb_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags);
ssize_t evb_fi_cq_sread(struct fid_cq *cq, void *buf, size_t count, const void *cond, int timeout);
const char *evb_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len);
int evb_fi_trywait(struct fid_fabric *fabric, struct fid **fids, int count);
uint32_t evb_fi_version(void);
