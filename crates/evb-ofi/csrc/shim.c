/* libfabric's data-path and object-creation calls are static inline functions
 * in its headers (they jump through per-object ops tables), so they have no
 * symbol to link against. These one-line wrappers give them one. */
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

int evb_fi_close(struct fid *fid) { return fi_close(fid); }
int evb_fi_control(struct fid *fid, int command, void *arg) { return fi_control(fid, command, arg); }

int evb_fi_domain(struct fid_fabric *fabric, struct fi_info *info, struct fid_domain **domain, void *context)
{ return fi_domain(fabric, info, domain, context); }
int evb_fi_endpoint(struct fid_domain *domain, struct fi_info *info, struct fid_ep **ep, void *context)
{ return fi_endpoint(domain, info, ep, context); }
int evb_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr, struct fid_cq **cq, void *context)
{ return fi_cq_open(domain, attr, cq, context); }
int evb_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr, struct fid_av **av, void *context)
{ return fi_av_open(domain, attr, av, context); }
int evb_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len, uint64_t access,
                  uint64_t offset, uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context)
{ return fi_mr_reg(domain, buf, len, access, offset, requested_key, flags, mr, context); }
void *evb_fi_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }

int evb_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags) { return fi_ep_bind(ep, bfid, flags); }
int evb_fi_enable(struct fid_ep *ep) { return fi_enable(ep); }
int evb_fi_getname(struct fid *fid, void *addr, size_t *addrlen) { return fi_getname(fid, addr, addrlen); }
ssize_t evb_fi_cancel(struct fid *fid, void *context) { return fi_cancel(fid, context); }
int evb_fi_av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *context)
{ return fi_av_insert(av, addr, count, fi_addr, flags, context); }

ssize_t evb_fi_tsendv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count,
                      fi_addr_t dest_addr, uint64_t tag, void *context)
{ return fi_tsendv(ep, iov, desc, count, dest_addr, tag, context); }
ssize_t evb_fi_trecv(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src_addr,
                     uint64_t tag, uint64_t ignore, void *context)
{ return fi_trecv(ep, buf, len, desc, src_addr, tag, ignore, context); }

/* A tagged receive with flags: FI_PEEK | FI_DISCARD drops one unexpected message. */
ssize_t evb_fi_tdiscard(struct fid_ep *ep, uint64_t tag, uint64_t ignore, void *context)
{
	struct fi_msg_tagged msg = {
		.msg_iov = NULL, .desc = NULL, .iov_count = 0, .addr = FI_ADDR_UNSPEC,
		.tag = tag, .ignore = ignore, .context = context, .data = 0,
	};
	return fi_trecvmsg(ep, &msg, FI_PEEK | FI_DISCARD);
}

ssize_t evb_fi_cq_read(struct fid_cq *cq, void *buf, size_t count) { return fi_cq_read(cq, buf, count); }
ssize_t evb_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags)
{ return fi_cq_readerr(cq, buf, flags); }
ssize_t evb_fi_cq_sread(struct fid_cq *cq, void *buf, size_t count, const void *cond, int timeout)
{ return fi_cq_sread(cq, buf, count, cond, timeout); }
const char *evb_fi_cq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len)
{ return fi_cq_strerror(cq, prov_errno, err_data, buf, len); }
int evb_fi_trywait(struct fid_fabric *fabric, struct fid **fids, int count) { return fi_trywait(fabric, fids, count); }

/* FI_VERSION is a function-like macro; bindgen does not evaluate it. */
uint32_t evb_fi_version(void) { return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION); }
