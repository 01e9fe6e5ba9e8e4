/* The UCX API evb-ucx binds: UCP for messaging, UCT only to list transports. */
#include <ucp/api/ucp.h>
#include <uct/api/uct.h>
